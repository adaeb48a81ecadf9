"""A profile's ``source``: the commit, and with local changes the tree of the files as they
were, which names the commit that later holds them (in a real git repository)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from lab.profile.provenance import source_revision


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def test_a_dirty_checkout_names_the_tree_its_files_make(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "--all")
    _git(repo, "commit", "-q", "-m", "one")
    clean = source_revision(repo)
    assert clean == _git(repo, "describe", "--always") and "tree" not in clean

    (repo / "a.py").write_text("x = 2\n")  # changed
    (repo / "b.py").write_text("y = 1\n")  # new, not yet added
    (repo / "build").mkdir()
    (repo / "build" / "out.bin").write_text("ignored\n")
    dirty = source_revision(repo)
    head = _git(repo, "rev-parse", "--short", "HEAD")
    assert dirty.startswith(f"{head}-dirty (tree ") and dirty.endswith(")")
    tree = dirty.split("(tree ")[1].rstrip(")")
    assert _git(repo, "diff", "--cached", "--name-only") == ""  # its own index untouched

    _git(repo, "add", "--all")
    _git(repo, "commit", "-q", "-m", "two")
    assert _git(repo, "rev-parse", "HEAD^{tree}").startswith(tree)


def test_outside_git_the_source_is_unknown(tmp_path: Path) -> None:
    assert source_revision(tmp_path) == "unknown"
