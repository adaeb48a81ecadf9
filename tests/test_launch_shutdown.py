"""Process lifecycle of ``engine serve``: readiness, shutdown, a dying child, auth."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import MODEL, Server, descendants, start_server, stop_server, wait_gone

pytestmark = pytest.mark.slow


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_sigterm_without_drain_stops_every_process_and_auth_is_enforced(model_ready: str) -> None:
    server = start_server("--api-key", "s3cret", "--num-tokenizers", "2", "--drain-timeout", "0")
    try:
        family = descendants(server.pid)
        roles = sorted(
            cmdline(p).split("engine.launch.child ")[1].split()[0]
            for p in family
            if "engine.launch.child" in cmdline(p)
        )
        assert roles == ["detokenizer", "scheduler", "tokenizer", "tokenizer"]
        body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
        assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        resp = httpx.post(f"{server.url}/v1/completions", json=body, headers=wrong, timeout=60)
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
        good = {"Authorization": "Bearer s3cret"}
        assert (
            httpx.post(
                f"{server.url}/v1/completions", json=body, headers=good, timeout=60
            ).status_code
            == 200
        )
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
        run_dir = Path(server.log().split("run dir ", 1)[1].split()[0])
        assert run_dir.is_dir() and (run_dir.stat().st_mode & 0o777) == 0o700
        long = {**body, "max_tokens": 2000, "ignore_eos": True, "stream": True}
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json=long, headers=good, timeout=60
        ) as stream:
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"  # open streams end with an error, then [DONE]
        assert '"error"' in rest[-2] and "shutting down" in rest[-2]
        assert server.proc.wait(30) == 0
        assert not wait_gone(family, 10), "children outlived SIGTERM"
        assert "Traceback" not in server.log()
        assert not run_dir.exists()
        assert "ignored SIGTERM" not in server.log()
    finally:
        stop_server(server)


def test_children_exit_when_the_server_is_killed(model_ready: str) -> None:
    server = start_server()
    family = descendants(server.pid)
    assert family
    run_dir = Path(server.log().split("run dir ", 1)[1].split()[0])
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    server.log_path.unlink(missing_ok=True)
    assert not wait_gone(family, 15), "children outlived a SIGKILLed parent"
    assert not run_dir.exists(), "the orphans left the run directory behind"


def test_unknown_model_is_a_clear_cli_error() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "lab.cli.engine",
            "serve",
            "--model",
            "no-such-model",
            "--port",
            "0",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "no-such-model" in out.stderr and "Traceback" not in out.stderr


def wait_for_log(server: Server, text: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in server.log():
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{server.log()}"
        time.sleep(0.05)


def test_one_sigterm_drains_and_a_second_one_shuts_down(model_ready: str) -> None:
    server = start_server("--dummy-weights", model="tiny-llama")
    try:
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(30) == 0
        log = server.log()
        assert "SIGTERM received; draining 0 open requests" in log and "drained" in log
        assert "shutting down" not in log  # the drain is the first signal's whole effect
    finally:
        stop_server(server)
    server = start_server()
    try:
        long = {"model": MODEL, "prompt": "Hi", "max_tokens": 2000, "ignore_eos": True}
        with httpx.stream(
            "POST", f"{server.url}/v1/completions", json={**long, "stream": True}, timeout=60
        ) as stream:
            # held: a dropped line iterator is finalized at once and closes the connection
            lines = stream.iter_lines()
            assert next(lines).startswith("data: ")
            assert server.metrics()["engine_num_requests_open"] == 1
            server.proc.send_signal(signal.SIGTERM)
            wait_for_log(server, "SIGTERM received; draining 1 open requests")
            assert server.metrics()["engine_num_requests_open"] == 1  # the drain lets it run
            server.proc.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
            assert server.proc.wait(30) == 0
        assert rest[-1] == "data: [DONE]" and "shutting down" in rest[-2]
        log = server.log()
        assert "SIGTERM received; shutting down" in log and "aborted: client" not in log
    finally:
        stop_server(server)
