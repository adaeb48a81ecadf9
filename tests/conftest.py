"""Fixtures that run ``engine serve`` as a real process tree on 127.0.0.1.

Every server started here is stopped at teardown, and every process it
spawned is checked gone (killed if not, and the test fails).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx
import pytest

MODEL = "smollm2-135m"
START_TIMEOUT_S = 240.0


def children_of() -> dict[int, list[int]]:
    """The process tree from /proc: parent pid -> child pids."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> set[int]:
    tree = children_of()
    out: set[int] = set()
    stack = [pid]
    while stack:
        for child in tree.get(stack.pop(), []):
            if child not in out:
                out.add(child)
                stack.append(child)
    return out


def alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def wait_gone(pids: set[int], timeout: float) -> set[int]:
    deadline = time.monotonic() + timeout
    left = {p for p in pids if alive(p)}
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p for p in left if alive(p)}
    return left


@dataclass
class Server:
    proc: subprocess.Popen[str]
    url: str
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def metrics(self) -> dict[str, float]:
        """The unlabelled-by-reason samples of /metrics, by metric name."""
        text = httpx.get(f"{self.url}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "reason=" in name_labels or "le=" in name_labels:
                continue
            out[name] = float(value)
        return out


def watch_url(proc: subprocess.Popen[str]) -> list[str]:
    """A list that gets the URL of the ``... at http://HOST:PORT`` line ``proc`` prints."""
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if " at http://" in line and not url:
                url.append(line.rsplit(" at ", 1)[1].strip())

    threading.Thread(target=read, daemon=True).start()
    return url


def start_server(*args: str, cpu_threads: int = 1, model: str = MODEL) -> Server:
    """Start ``engine serve --model MODEL`` on a free port and wait for its URL line."""
    log = Path(tempfile.mkstemp(prefix="engine-serve-", suffix=".log")[1])
    cmd = [
        sys.executable, "-m", "lab.cli.engine", "serve", "--model", model, "--port", "0",
        "--host", "127.0.0.1", "--cpu-threads", str(cpu_threads), "--log-level", "info", *args,
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, stdin=subprocess.DEVNULL
    )
    url = watch_url(proc)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not url:
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log.read_text(errors="replace")[-4000:]
            stop_server(Server(proc, "", log), check=False)
            pytest.fail(f"engine serve did not start:\n{text}")
        time.sleep(0.1)
    return Server(proc, url[0], log)


def stop_server(server: Server, check: bool = True) -> None:
    """SIGTERM the server; kill whatever is left. With ``check``, fail if anything lingered."""
    family = descendants(server.pid)
    if server.proc.poll() is None:
        server.proc.send_signal(signal.SIGTERM)
    try:
        server.proc.wait(30)
    except subprocess.TimeoutExpired:
        server.proc.kill()
        server.proc.wait()
    left = wait_gone(family, 10)
    for pid in left:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if check and left:
        pytest.fail(f"processes left behind after shutdown: {sorted(left)}")
    server.log_path.unlink(missing_ok=True)


def greedy_ids(server: Server, prompt: str) -> list[int]:
    """Eight greedy tokens of ``prompt`` from ``/generate``."""
    resp = httpx.post(
        f"{server.url}/generate",
        json={
            "text": prompt,
            "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
        },
        timeout=120,
    )
    assert resp.status_code == 200, resp.text
    ids = resp.json()["output_ids"]
    assert len(ids) == 8
    return list(ids)


@contextmanager
def running_server(*args: str, cpu_threads: int = 1, model: str = MODEL) -> Iterator[Server]:
    server = start_server(*args, cpu_threads=cpu_threads, model=model)
    try:
        yield server
    finally:
        stop_server(server)


@pytest.fixture(scope="session")
def model_ready() -> str:
    from engine.models.setup import ensure_model

    return str(ensure_model(MODEL))


@pytest.fixture(scope="session")
def server(model_ready: str) -> Iterator[Server]:
    """One tp=1 server shared by the tests that only send requests."""
    with running_server("--num-pages", "1024", cpu_threads=2) as s:
        yield s


@contextmanager
def spawned(target: Any) -> Iterator[Connection]:
    """A spawned process running ``target(conn)``, and this side of its pipe; at exit it is
    sent ``("stop",)`` and must exit 0 (it is killed if it does not exit)."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(there,))
    proc.start()
    there.close()
    try:
        yield here
        here.send(("stop",))
        proc.join(timeout=30)
        assert proc.exitcode == 0, f"spawned process exit code {proc.exitcode}"
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=10)
        here.close()
