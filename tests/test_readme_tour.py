"""The README's tour runs as written: its code blocks, in order, as one shell session.

The blocks of the section "A ten-minute tour on a laptop" become one bash script, with
three substitutions only: this test's free port for 8000, a temporary folder for ``out/``,
and this interpreter's ``bin/`` for ``.venv/bin/``. A Python block runs with this
interpreter at its place in the order. The server the tour starts is killed with its
process group at the end, whatever happened.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOUR = "## A ten-minute tour on a laptop"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def tour_blocks(readme: str) -> list[tuple[str, str]]:
    """The (language, code) of each fenced block in the tour's section."""
    start = readme.index(TOUR)
    end = readme.find("\n## ", start + len(TOUR))
    return FENCE.findall(readme[start : end if end >= 0 else None])


def tour_script(blocks: list[tuple[str, str]], port: int, out: Path) -> str:
    bin_dir = str(Path(sys.executable).parent)
    lines = ["set -euo pipefail"]
    for lang, code in blocks:
        code = code.replace("8000", str(port)).replace(".venv/bin/", bin_dir + "/")
        code = re.sub(r"(?<![\w/])out/", f"{out}/", code)
        if lang == "python":
            lines += [f"{sys.executable} - <<'PYTHON'", code.rstrip("\n"), "PYTHON"]
        else:
            assert lang == "bash", f"the tour has a {lang} block"
            lines.append(code)
    return "\n".join(lines) + "\n"


def test_the_tour_has_every_step() -> None:
    blocks = tour_blocks((ROOT / "README.md").read_text())
    text = "\n".join(code for _, code in blocks)
    for step in ("engine serve", "OpenAI(", "engine bench", "sim replay", "sim validate"):
        assert step in text, f"the tour lost its {step!r} step"


def test_the_tour_runs_as_written(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    script = tour_script(tour_blocks((ROOT / "README.md").read_text()), free_port(), out)
    (tmp_path / "tour.sh").write_text(script)
    proc = subprocess.Popen(
        ["bash", str(tmp_path / "tour.sh")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        log, _ = proc.communicate(timeout=540)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 0, f"the tour failed:\n{log[-6000:]}"
    assert "requests arriving over" in log  # engine bench says how long it will take
    for folder in ("tour/bench", "tour/sim", "tour/validate"):
        assert (out / folder / "summary.json").is_file() or (
            out / folder / "comparison.json"
        ).is_file(), f"no outputs in {folder}:\n{log[-4000:]}"
    bench = json.loads((out / "tour/bench/summary.json").read_text())
    assert bench["completed"] == bench["num_requests"] == 30
    comparison = json.loads((out / "tour/validate/comparison.json").read_text())
    assert comparison, "sim validate compared nothing"
