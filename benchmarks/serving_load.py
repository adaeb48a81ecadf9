"""Helpers of the load benchmarks (abort storm, overload): a server process, its metrics,
the memory of its process tree, and one streamed completion; and the flags of a benchmark.

Imported by the benchmarks beside it (``abort_storm.py``, ``overload.py``, ``layout_ab.py``,
``layout_load.py``, ``cpu_serving.py``, ``reservation_engine.py``, ``router_overhead.py``,
``scheduler_step.py``, ``pd_load.py``) and by the small versions of the first two in ``tests/``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

MODEL = "smollm2-135m"


@dataclass
class Stream:
    """What one streamed completion got: its text, how it ended, when its chunks came."""

    status: int = 0
    text: str = ""
    finish: str | None = None
    done: bool = False  # ``[DONE]`` arrived
    error: str | None = None
    retry_after: str | None = None
    chunk_times: list[float] = field(default_factory=list)
    meta_info: dict[str, Any] | None = None  # the stage timestamps, when the body asked for them


async def stream_completion(
    client: httpx.AsyncClient,
    body: dict[str, object],
    stop_after: int | None = None,
    out: Stream | None = None,
) -> Stream:
    """POST a streamed ``/v1/completions``; with ``stop_after`` k, close the connection after
    k chunks (a client that goes away mid-stream). ``out``: the ``Stream`` to fill, which the
    caller may watch grow."""
    out = Stream() if out is None else out
    async with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as resp:
        out.status = resp.status_code
        if resp.status_code != 200:
            await resp.aread()
            out.error = resp.text
            out.retry_after = resp.headers.get("retry-after")
            return out
        async for line in resp.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                out.done = True
                break
            chunk = json.loads(line[6:])
            if "error" in chunk:
                out.error = chunk["error"]["message"]
                continue
            out.chunk_times.append(time.monotonic())
            out.text += chunk["choices"][0]["text"]
            out.finish = chunk["choices"][0]["finish_reason"] or out.finish
            out.meta_info = chunk.get("meta_info", out.meta_info)
            if stop_after is not None and len(out.chunk_times) >= stop_after:
                break
    return out


def scrape(url: str) -> dict[str, float]:
    """The samples of ``/metrics`` by name, summed over replicas; labels other than
    ``model_name`` and ``replica`` stay in the key."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, value = line.rsplit(" ", 1)
        name, _, labels = key.partition("{")
        kept = [
            p
            for p in labels.rstrip("}").split(",")
            if p and not p.startswith(("model_name=", "replica="))
        ]
        key = name + ("{" + ",".join(kept) + "}" if kept else "")
        out[key] = out.get(key, 0.0) + float(value)
    return out


def tree_rss_mib(pid: int) -> float:
    """Resident memory of ``pid`` and all its descendants, in MiB."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parents[int(entry)] = int(stat.rsplit(")", 1)[1].split()[1])
    family = {pid}
    grew = True
    while grew:
        new = {p for p, parent in parents.items() if parent in family} - family
        family |= new
        grew = bool(new)
    total = 0
    for p in family:
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total += next((int(x.split()[1]) for x in status.splitlines() if x.startswith("VmRSS")), 0)
    return total / 1024


@contextmanager
def served(
    *args: str, threads: int = 2, model: str = MODEL
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``engine serve --model MODEL ARGS`` on a free port; stopped (SIGTERM) at exit."""
    cmd = [
        "serve", "--model", model, "--port", "0", "--cpu-threads", str(threads),
        "--log-level", "warning", *args,
    ]  # fmt: skip
    with launched(*cmd) as started:
        yield started


@contextmanager
def launched(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``engine ARGS`` (a server or the router), once it prints the URL it serves at; stopped
    (SIGTERM, then killed after 60 s) at exit."""
    cmd = [sys.executable, "-m", "lab.cli.engine", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    url: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            if " at http://" in line:
                url.append(line.rsplit(" at ", 1)[1].strip())

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 300
    try:
        while not url:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"engine {args[0]} did not start")
            time.sleep(0.1)
        yield proc, url[0]
    finally:
        proc.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            proc.wait(60)
        proc.kill()  # nothing when it has exited
        proc.wait()


def parse_flags(description: str, **defaults: float | str | Path) -> argparse.Namespace:
    """The command line of a benchmark whose flags are ``--NAME VALUE``, one per keyword
    (``max_tokens=8``: ``--max-tokens``, default 8, read with ``type(8)``)."""
    parser = argparse.ArgumentParser(description=description)
    for name, default in defaults.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return parser.parse_args()


def write_runs(path: Path, runs: list[dict[str, Any]], **extra: Any) -> None:
    """A benchmark's runs as JSON in ``path``, with the command line that made them (and
    ``extra``'s keys, what the benchmark concludes from them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {"command": "python " + " ".join(sys.argv), "runs": runs, **extra}
    path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {path}")


def wait_idle(url: str, timeout: float = 60.0) -> dict[str, float]:
    """Metrics once no request runs, waits or is open (or the last ones after ``timeout``)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(url)
        busy = (
            m["engine_num_requests_running"]
            + m["engine_num_requests_waiting"]
            + m["engine_num_requests_open"]
        )
        if busy == 0 or time.monotonic() > deadline:
            return m
        time.sleep(0.1)
