"""``sim profile merge``: two runs of one grid's points as one profile."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.scheduler.shape import StepShape
from lab.cli.sim import main as sim_main
from sim.costs.profile import EMPTY_SHAPE, ProfileRow, read_profile, write_profile


def profile(path: Path, model: str, batches: tuple[int, ...], tokenize: float) -> Path:
    rows = [
        ProfileRow("decode", StepShape.decode(b, 100 * b, 100), 1, 1e-3 * b, 1e-3 * b, 1e-3 * b, 3)
        for b in batches
    ]
    rows.append(ProfileRow("tokenize", EMPTY_SHAPE, 1, tokenize, tokenize, tokenize, 1))
    info = {
        "hardware": "1x H",
        "model": model,
        "date": f"d{len(batches)}",
        "command": "c",
        "tp": "1",
    }
    write_profile(path, info, rows)
    return path


def merge(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    """``sim profile merge ARGS``: its exit status and what it wrote to stderr."""
    code = sim_main(["profile", "merge", *map(str, args)])
    return code, capsys.readouterr().err


def test_the_step_rows_go_together_and_the_first_gives_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = profile(tmp_path / "a.csv", "m", (1, 2, 4), 5e-6)
    b = profile(tmp_path / "b.csv", "m", (8, 16), 9e-6)
    out = tmp_path / "ab.csv"
    code, err = merge(capsys, a, b, "--out", out)
    assert code == 0, err
    merged = read_profile(out)
    assert sorted(r.shape.decode_requests for r in merged.steps) == [1, 2, 4, 8, 16]
    assert merged.cpu == {"tokenize": 5e-6}
    assert merged.provenance["date"] == "d3" and merged.provenance["merged_1_date"] == "d2"
    assert "fit error over 5 rows" in merged.provenance["table_fit"]


def test_profiles_of_other_models_or_missing_files_do_not_merge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a = profile(tmp_path / "a.csv", "m", (1, 2), 5e-6)
    b = profile(tmp_path / "b.csv", "other", (4,), 5e-6)
    code, err = merge(capsys, a, b, "--out", tmp_path / "ab.csv")
    assert code == 2 and "model" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "ab.csv").exists()
    code, err = merge(capsys, a, tmp_path / "none.csv", "--out", tmp_path / "ab.csv")
    assert (
        code == 2
        and err == f"sim profile merge: error: {tmp_path}/none.csv: no such profile file\n"
    )


def test_passes_of_one_grid_give_each_plan_the_median_of_its_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def one_pass(name: str, scale: float, batches: tuple[int, ...]) -> Path:
        t = [scale * b for b in batches]
        rows = [
            ProfileRow("decode", StepShape.decode(b, 100 * b, 100), 1, x, x, x, 1, "fit", 2 * x)
            for b, x in zip(batches, t, strict=True)
        ]
        rows.append(ProfileRow("tokenize", EMPTY_SHAPE, 1, 5e-6, 5e-6, 5e-6, 1))
        info = {"hardware": "1x H", "model": "m", "date": name, "command": "c", "tp": "1"}
        write_profile(tmp_path / name, info, rows)
        return tmp_path / name

    # the third pass caught a slow minute; batch 4 was left out of the second
    passes = [one_pass("p1.csv", 1e-3, (1, 2, 4)), one_pass("p2.csv", 1.1e-3, (1, 2)),
              one_pass("p3.csv", 3e-3, (1, 2, 4))]  # fmt: skip
    out = tmp_path / "median.csv"
    code, err = merge(capsys, *passes, "--median", "--out", out)
    assert code == 0, err
    merged = read_profile(out)
    rows = {r.shape.decode_requests: r for r in merged.steps}
    assert sorted(rows) == [1, 2, 4]
    one = rows[1]
    assert one.duration_s == pytest.approx(1.1e-3) and one.device_time == pytest.approx(2.2e-3)
    assert (one.min_s, one.max_s, one.repeats) == (pytest.approx(1e-3), pytest.approx(3e-3), 3)
    assert rows[4].duration_s == pytest.approx(8e-3) and rows[4].repeats == 2
    assert merged.provenance["passes"].startswith("3,")
    appended = tmp_path / "appended.csv"
    assert merge(capsys, *passes, "--out", appended)[0] == 0
    assert len(read_profile(appended).steps) == 8
