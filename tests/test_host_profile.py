"""``engine serve --host-profile DIR``: each process's call tree while serving, written at exit."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import running_server

from engine.ipc.host_profile import check_dir, profiled, serving


def busy(seconds: float) -> int:
    """Python work the sampler sees: a named frame in the tree."""
    end, n = time.perf_counter() + seconds, 0
    while time.perf_counter() < end:
        n += sum(range(100))
    return n


def test_a_process_that_never_served_writes_nothing(tmp_path: Path) -> None:
    with profiled(str(tmp_path), "starting"):
        busy(0.05)  # start-up: sampling starts only once the process serves
    assert list(tmp_path.iterdir()) == []
    with profiled(None, "off"):
        serving()  # no folder: no profiler to start
        busy(0.01)
    assert list(tmp_path.iterdir()) == []


def test_sampling_covers_serving_only_and_survives_an_exit(tmp_path: Path) -> None:
    with pytest.raises(SystemExit), profiled(str(tmp_path), "worker"):
        busy(0.05)
        serving()
        busy(0.2)
        raise SystemExit(0)  # how SIGTERM ends a child
    text = (tmp_path / "worker.txt").read_text()
    assert "busy" in text and "test_sampling_covers_serving_only" in text
    speedscope = json.loads((tmp_path / "worker.speedscope.json").read_text())
    assert "speedscope" in speedscope["$schema"]
    names = {f["name"] for f in speedscope["shared"]["frames"]}
    assert "busy" in names


def test_check_dir_creates_the_folder_and_refuses_a_file(tmp_path: Path) -> None:
    assert check_dir(str(tmp_path / "a" / "b")) == (tmp_path / "a" / "b").resolve()
    assert (tmp_path / "a" / "b").is_dir()
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(ValueError, match="not a folder"):
        check_dir(str(file))


def test_serve_refuses_a_file_as_the_profile_folder(tmp_path: Path) -> None:
    file = tmp_path / "taken"
    file.write_text("x")
    cmd = [sys.executable, "-m", "lab.cli.engine", "serve", "--model", "tiny-llama",
           "--dummy-weights", "--port", "0",
           "--host-profile", str(file)]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"--host-profile {file}: not a folder" in proc.stderr


def test_every_process_writes_its_serving_tree_at_exit(model_ready: str, tmp_path: Path) -> None:
    folder = tmp_path / "profile"
    with running_server("--num-pages", "256", "--host-profile", str(folder)) as server:
        # streamed, so that the frontend's handler runs at every token and the sampler sees it
        body = {"model": "smollm2-135m", "prompt": "Hello there", "max_tokens": 24,
                "stream": True, "ignore_eos": True}  # fmt: skip
        for _ in range(3):
            with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
                assert r.status_code == 200
                assert sum(line.startswith("data: ") for line in r.iter_lines()) > 24
    # the serving loop of each process, and none of its start-up (the tokenizer's load)
    loops = {
        "frontend": "engine/server/",  # the request's handler or its SSE stream
        "tokenizer0": "run_tokenizer",
        "scheduler0": "SchedulerLoop.run",
        "detokenizer0": "run_detokenizer",
    }
    for name, loop in loops.items():
        text = (folder / f"{name}.txt").read_text()
        assert loop in text, (name, text)
        assert "load_tokenizer" not in text, (name, text)
        json.loads((folder / f"{name}.speedscope.json").read_text())
    assert "ModelRunner.launch" in (folder / "scheduler0.txt").read_text()
