"""``sim policy-gap``: two policies' latency difference, real against simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.cli.sim import main as sim_main


def validation(folder: Path, real: float, sim: float) -> Path:
    folder.mkdir()
    entry = {"real": real, "sim": sim, "rel_err": sim / real - 1}
    (folder / "comparison.json").write_text(json.dumps({"ttft_ms": {"p90": entry}}))
    return folder


def gap(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str, str]:
    """``sim policy-gap ARGS``: its exit status, stdout and stderr."""
    code = sim_main(["policy-gap", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def test_the_difference_and_its_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rr = validation(tmp_path / "rr", 2000.0, 1900.0)
    ca = validation(tmp_path / "ca", 500.0, 600.0)
    code, out, err = gap(capsys, rr, ca)
    assert code == 0, err
    assert out.splitlines()[-1] == "difference: real 1,500.0, simulated 1,300.0, error -13.3%"
    assert "(-5.0%)" in out and "(+20.0%)" in out


def test_a_missing_validation_or_metric_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rr = validation(tmp_path / "rr", 2000.0, 1900.0)
    code, _, err = gap(capsys, rr, tmp_path / "none")
    assert code == 2 and "holds no comparison.json" in err and len(err.splitlines()) == 1
    code, _, err = gap(capsys, rr, rr, "--quantile", "p75")
    assert code == 2 and "has no ttft_ms p75" in err
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "comparison.json").write_text("{not json")
    code, _, err = gap(capsys, rr, tmp_path / "bad")
    assert code == 2 and err.startswith("sim policy-gap: error: ") and "not JSON" in err
