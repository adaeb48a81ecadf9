"""``scripts/compare_profiles.py``: two engines' passes of one grid, compared pair by pair."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from core.scheduler.shape import StepShape
from sim.costs.profile import ProfileRow, write_profile

SCRIPT = str(Path(__file__).resolve().parents[1] / "scripts" / "compare_profiles.py")


def profile(path: Path, seconds: dict[int, float]) -> Path:
    """A profile of decode plans (batch -> seconds)."""
    rows = [
        ProfileRow("decode", StepShape.decode(b, 1000 * b, 1000), 1, s, s, s, 3)
        for b, s in seconds.items()
    ]
    write_profile(
        path, {"hardware": "CPU", "model": "m", "tp": "1", "date": "d", "command": "c"}, rows
    )
    return path


def run(*args: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)


def test_each_plan_is_the_median_of_its_pairs_ratios(tmp_path: Path) -> None:
    base = [profile(tmp_path / f"b{i}.csv", {8: 0.2, 16: t}) for i, t in enumerate((0.9, 1.0, 0.6))]
    new = [profile(tmp_path / f"n{i}.csv", {8: 0.2, 16: 0.5}) for i in range(3)]
    done = run("--base", *base, "--new", *new)
    assert done.returncode == 0, done.stderr
    rows = {line.split(" | ")[0]: line for line in done.stdout.splitlines() if "decode" in line}
    assert rows["| decode 16 x 1,000"].endswith("| 1.80 / 2.00 / 1.20 | **1.80** |")
    assert rows["| decode 8 x 1,000"].endswith("| 1.00 / 1.00 / 1.00 | **1.00** |")
    assert "2 plans: base / new 1.34 (geometric mean of the medians), 1.00-1.80" in done.stdout


def test_unpaired_passes_or_another_grid_are_refused(tmp_path: Path) -> None:
    a = profile(tmp_path / "a.csv", {8: 0.2, 16: 0.4})
    b = profile(tmp_path / "b.csv", {8: 0.2})
    done = run("--base", a, a, "--new", a)
    assert done.returncode == 2 and "as many --base as --new" in done.stderr
    done = run("--base", a, "--new", b)
    assert done.returncode == 2 and "has no decode 16 x 1,000" in done.stderr
