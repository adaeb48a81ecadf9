"""``sim profile compare``: two engines' passes of one grid, compared pair by pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.scheduler.shape import StepShape
from lab.cli.sim import main as sim_main
from sim.costs.profile import ProfileRow, write_profile


def profile(path: Path, seconds: dict[int, float], launch: float | None = None) -> Path:
    """A profile of decode plans (batch -> seconds), each launched in ``launch`` seconds."""
    rows = [
        ProfileRow("decode", StepShape.decode(b, 1000 * b, 1000), 1, s, s, s, 3, "fit", s, launch)
        for b, s in seconds.items()
    ]
    write_profile(
        path, {"hardware": "CPU", "model": "m", "tp": "1", "date": "d", "command": "c"}, rows
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``sim profile compare ARGS``: its exit status, stdout and stderr."""
    code = sim_main(["profile", "compare", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_each_plan_is_the_median_of_its_pairs_ratios(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [profile(tmp_path / f"b{i}.csv", {8: 0.2, 16: t}) for i, t in enumerate((0.9, 1.0, 0.6))]
    new = [profile(tmp_path / f"n{i}.csv", {8: 0.2, 16: 0.5}) for i in range(3)]
    code, out, err = run(capsys, "--base", *base, "--new", *new)
    assert code == 0, err
    rows = {line.split(" | ")[0]: line for line in out.splitlines() if "decode" in line}
    assert rows["| decode 16 x 1,000"].endswith("| 1.80 / 2.00 / 1.20 | **1.80** |")
    assert rows["| decode 8 x 1,000"].endswith("| 1.00 / 1.00 / 1.00 | **1.00** |")
    assert "2 plans: base / new 1.34 (geometric mean of the medians), 1.00-1.80" in out


def test_unpaired_passes_another_grid_or_no_file_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = profile(tmp_path / "a.csv", {8: 0.2, 16: 0.4})
    b = profile(tmp_path / "b.csv", {8: 0.2})
    code, _, err = run(capsys, "--base", a, a, "--new", a)
    assert code == 2 and "as many --base as --new" in err
    code, _, err = run(capsys, "--base", a, "--new", b)
    assert code == 2 and "has no decode 16 x 1,000" in err
    code, out, err = run(capsys, "--base", a, "--new", tmp_path / "none.csv")
    assert code == 2 and not out and err.startswith("sim profile compare: error: ")
    assert "no such profile file" in err and len(err.splitlines()) == 1


def test_launch_times_compare_as_wall_times_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An eager step's launch, repeated (warm) against once between other plans (cold)."""
    warm = profile(tmp_path / "warm.csv", {8: 0.2, 16: 0.4}, launch=0.008)
    cold = profile(tmp_path / "cold.csv", {8: 0.2, 16: 0.4}, launch=0.016)
    code, out, err = run(capsys, "--base", cold, "--new", warm, "--measure", "launch")
    assert code == 0, err
    assert "2 plans: base / new 2.00" in out
    code, out, _ = run(capsys, "--base", cold, "--new", warm)
    assert "2 plans: base / new 1.00" in out
    unlaunched = profile(tmp_path / "none.csv", {8: 0.2, 16: 0.4})
    code, _, err = run(capsys, "--base", unlaunched, "--new", warm, "--measure", "launch")
    assert code == 2 and "has no launch times" in err
