"""``scripts/policy_gap.py``: two policies' latency difference, real against simulated."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "scripts" / "policy_gap.py")


def validation(folder: Path, real: float, sim: float) -> Path:
    folder.mkdir()
    entry = {"real": real, "sim": sim, "rel_err": sim / real - 1}
    (folder / "comparison.json").write_text(json.dumps({"ttft_ms": {"p90": entry}}))
    return folder


def gap(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)


def test_the_difference_and_its_error(tmp_path: Path) -> None:
    rr = validation(tmp_path / "rr", 2000.0, 1900.0)
    ca = validation(tmp_path / "ca", 500.0, 600.0)
    done = gap(str(rr), str(ca))
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last == "difference: real 1,500.0, simulated 1,300.0, error -13.3%"
    assert "(-5.0%)" in done.stdout and "(+20.0%)" in done.stdout


def test_a_missing_validation_or_metric_is_a_clear_error(tmp_path: Path) -> None:
    rr = validation(tmp_path / "rr", 2000.0, 1900.0)
    done = gap(str(rr), str(tmp_path / "none"))
    assert done.returncode == 2 and "holds no comparison.json" in done.stderr
    done = gap(str(rr), str(rr), "--quantile", "p75")
    assert done.returncode == 2 and "has no ttft_ms p75" in done.stderr
