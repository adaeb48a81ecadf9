"""``engine profile`` refuses to write over a profile measured on other hardware."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.runner.hardware import hardware
from lab.profile.main import overwrite_refusal, profile_main

COMMITTED = Path(__file__).resolve().parents[1] / "profiles/cpu-epyc-2core_smollm2-135m.csv"


def _profile_of(tmp_path: Path, machine: str) -> Path:
    lines = COMMITTED.read_text().splitlines()
    lines = [f"# hardware: {machine}" if ln.startswith("# hardware:") else ln for ln in lines]
    path = tmp_path / "profile.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_profile_of_other_hardware_is_kept(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _profile_of(tmp_path, "CPU: Another Processor, 64 cores")
    before = path.read_text()
    argv = ["--model", "tiny-llama", "--dummy-weights", "--out", str(path)]
    with pytest.raises(SystemExit) as exit_info:
        profile_main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "Another Processor" in err and "--overwrite" in err
    assert path.read_text() == before


def test_the_same_hardware_or_a_new_file_may_be_written(tmp_path: Path) -> None:
    here = hardware("cpu", 1)
    assert overwrite_refusal(_profile_of(tmp_path, here), here) is None
    assert overwrite_refusal(tmp_path / "new.csv", here) is None
    assert overwrite_refusal(_profile_of(tmp_path, "2x NVIDIA H200"), here) is not None
