"""Where a profile's numbers come from: hardware, software, model and runner settings."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "tokenizers", "flashinfer-python", "pyzmq", "fastapi")


def versions() -> str:
    found = [f"python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    if torch.version.cuda:
        found.append(f"cuda {torch.version.cuda}")
    return ", ".join(found)


def _git(root: Path, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        env=env,
    )
    return out.stdout.strip()


def source_revision(root: Path = ROOT) -> str:
    """The git commit of this checkout, or ``unknown``. With local changes:
    ``COMMIT-dirty (tree T)``, ``T`` the git tree of the working files as they are (tracked
    and untracked, ignored ones left out), which is the tree of the commit that later holds
    exactly them (``git log --format='%h %T'`` finds it) even where the checkout's own
    history lags its files."""
    try:
        rev = _git(root, "describe", "--always", "--dirty")
        if rev.endswith("-dirty"):
            with tempfile.TemporaryDirectory() as tmp:
                env = {**os.environ, "GIT_INDEX_FILE": str(Path(tmp) / "index")}
                _git(root, "add", "--all", ".", env=env)
                rev += f" (tree {_git(root, 'write-tree', env=env)[:12]})"
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev or "unknown"


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
