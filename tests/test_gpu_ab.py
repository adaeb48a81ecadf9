"""``scripts/gpu_ab.sh``: a command against a base commit's code and the tree's, in turn; the
base comes from ``scripts/gpu_prepare.py --base REV``."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_ab.sh"


def _prepare() -> object:
    spec = importlib.util.spec_from_file_location("gpu_prepare", ROOT / "scripts/gpu_prepare.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    dest = tmp_path_factory.mktemp("ab") / "base"
    _prepare().export_base("HEAD", dest)  # type: ignore[attr-defined]
    return dest


def _ab(base: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "AB_BASE": str(base)}
    return subprocess.run(
        ["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120
    )


def test_base_holds_the_commits_code_without_reports(base: Path) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    assert (base / ".ab_rev").read_text().strip() == head.stdout.strip()
    assert (base / "engine" / "runner" / "staging.py").is_file()
    assert not (base / "reports").exists() and not (base / "tests").exists()
    with pytest.raises(SystemExit, match="not a commit"):
        _prepare().export_base("no-such-rev", base.parent / "other")  # type: ignore[attr-defined]


def test_rounds_alternate_base_then_tree_each_with_its_own_code(base: Path) -> None:
    code = "import engine, os; print(os.environ['AB'], os.environ['AB_ROUND'], engine.__file__)"
    out = _ab(base, "2", f'{sys.executable} -c "{code}"')
    assert out.returncode == 0, out.stderr
    runs = [line.split() for line in out.stdout.splitlines() if not line.startswith("==")]
    order = [("base", "1"), ("new", "1"), ("base", "2"), ("new", "2")]
    assert [(ab, r) for ab, r, _ in runs] == order
    for ab, _, path in runs:
        home = base if ab == "base" else ROOT
        assert Path(path).resolve().is_relative_to(home.resolve()), (ab, path)


def test_a_failing_round_is_reported_and_the_rest_run(base: Path) -> None:
    out = _ab(base, "2", 'echo ran $AB; [ "$AB" = new ] || exit 3')
    assert out.returncode == 3
    assert out.stdout.count("ran ") == 4 and out.stdout.count("exit 3") == 2


@pytest.mark.parametrize("args", [(), ("0", "true"), ("x", "true"), ("1",)])
def test_bad_usage_exits_2(base: Path, args: tuple[str, ...]) -> None:
    out = _ab(base, *args)
    assert out.returncode == 2 and "usage" in out.stderr


def test_a_missing_base_says_how_to_make_one(tmp_path: Path) -> None:
    out = _ab(tmp_path / "none", "1", "true")
    assert out.returncode == 2 and "gpu_prepare.py --base" in out.stderr
