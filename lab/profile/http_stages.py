"""The HTTP side's CPU costs, timed through the real frontend application.

The app of ``engine serve`` (``create_app``: routes, ``Frontend``, metrics,
SSE) runs under uvicorn in a child process, as it serves; a thread there plays
the rest of the pipeline on the app's own ZeroMQ sockets: it pulls each
``GenerateRequest`` where the tokenizer worker would, and pushes ``TextBatch``
messages where the detokenizer would, as the detokenizer does under load: one
batch per model step, with one text item for every request that is streaming.
``C`` concurrent streamed ``/v1/completions`` requests of N tokens each, sent
over TCP by an asyncio client in this process, then cost

    t(C, N) = C * frontend + C * N * stream

of CPU time in the child's thread that runs the event loop (read from
``/proc``), fitted by least squares over several N: ``frontend`` in seconds
per request (parse, validate, submit, open the stream) and ``stream`` in
seconds per streamed chunk (receive, metrics, SSE event, the socket write),
with C = ``CONCURRENCY``. The clients' work is not counted, as it is not in
the server of a real deployment. (Timed instead behind Starlette's in-process
test client, whose side of every chunk runs on the app's loop, a chunk cost
4-5x as much: 150-159 against 36-43 us on a 2-core development machine.)
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import queue
import socket
import tempfile
import threading
import time
from multiprocessing.process import BaseProcess
from multiprocessing.queues import Queue
from pathlib import Path

import numpy as np
import zmq

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.runner.args import RunnerArgs
from lab.profile.cpu_stages import StageCost

TOKEN_COUNTS = (1, 32, 128, 256)
CONCURRENCY = 32


def _pipeline(cfg: ServeConfig, stop: threading.Event, group: int) -> None:
    """Answer requests ``group`` at a time: for each token, one batch with an item each."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(cfg.tokenizer_addr(0))
    out = ctx.socket(zmq.PUSH)
    out.connect(cfg.frontend_addr)
    waiting: list[messages.GenerateRequest] = []
    try:
        while not stop.is_set():
            if not inbox.poll(50):
                continue
            req = messages.decode(inbox.recv())
            if isinstance(req, messages.GenerateRequest):
                waiting.append(req)
            if len(waiting) < group:
                continue
            n = max(r.sampling.max_new_tokens for r in waiting)
            for i in range(n):
                items = [
                    messages.TextItem(
                        rid=r.rid,
                        text=" a",
                        token_ids=[i],
                        token_times=[time.time()],
                        finish_reason="length" if i == r.sampling.max_new_tokens - 1 else None,
                        prompt_tokens=1 if i == 0 else 0,
                    )
                    for r in waiting
                    if i < r.sampling.max_new_tokens
                ]
                out.send(messages.encode(messages.TextBatch(items=items)))
            waiting = []
    finally:
        inbox.close(linger=0)
        out.close(linger=0)
        ctx.term()


def measure_http(repeats: int, concurrency: int = CONCURRENCY) -> tuple[StageCost, StageCost]:
    """``frontend`` (per request) and ``stream`` (per chunk) costs, ``concurrency``
    requests streaming at a time."""
    if not Path("/proc/self/task").is_dir():
        raise RuntimeError("timing the frontend reads a thread's CPU time from /proc (Linux)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    spawn = multiprocessing.get_context("spawn")
    ready = spawn.Queue()
    run_dir = tempfile.TemporaryDirectory()  # the child's sockets; removed here, after it
    child = spawn.Process(target=_serve, args=(port, concurrency, run_dir.name, ready),
                          daemon=True)  # fmt: skip
    child.start()
    try:
        loop_thread = _wait_ready(child, ready, port)
        fits: list[tuple[float, float]] = []

        def together(n: int) -> float:
            start = _thread_cpu(child.pid, loop_thread)
            asyncio.run(_streams(port, concurrency, n))
            return (_thread_cpu(child.pid, loop_thread) - start) / concurrency

        for n in TOKEN_COUNTS:
            together(n)  # warm up
        for _ in range(repeats):
            times = [together(n) for n in TOKEN_COUNTS]
            x = np.array([[1.0, n] for n in TOKEN_COUNTS])
            (per_request, per_chunk), *_ = np.linalg.lstsq(x, np.array(times), rcond=None)
            fits.append((max(float(per_request), 0.0), max(float(per_chunk), 0.0)))
    finally:
        child.terminate()
        child.join(10)
        run_dir.cleanup()
    return (
        StageCost.of("frontend", [f[0] for f in fits]),
        StageCost.of("stream", [f[1] for f in fits]),
    )


def _serve(port: int, concurrency: int, run_dir: str, ready: Queue[int]) -> None:
    """The child: the app under uvicorn, the pipeline beside it; reports its loop's thread."""
    import uvicorn

    from engine.server.app import create_app

    cfg = ServeConfig(
        model="profile",
        runner=RunnerArgs(model="profile"),
        tokenizer_path="",
        vocab_size=1 << 16,
        run_dir=run_dir,
        parent_pid=os.getppid(),  # the profiling process
        max_model_len=1 << 20,
    )
    stop = threading.Event()
    threading.Thread(target=_pipeline, args=(cfg, stop, concurrency), daemon=True).start()
    ready.put(threading.get_native_id())  # uvicorn runs its loop in this thread
    app = create_app(cfg, health=lambda: None)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


def _wait_ready(child: BaseProcess, ready: Queue[int], port: int, timeout: float = 60.0) -> int:
    """The child's loop thread once its server accepts connections."""
    deadline = time.monotonic() + timeout
    loop_thread: int | None = None
    while time.monotonic() < deadline:
        if not child.is_alive():
            raise RuntimeError(f"the frontend's timing server exited ({child.exitcode})")
        if loop_thread is None:
            with contextlib.suppress(queue.Empty):
                loop_thread = ready.get(timeout=0.2)
            continue
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return loop_thread
        time.sleep(0.1)
    raise RuntimeError(f"the frontend's timing server did not start in {timeout:g} s")


def _thread_cpu(pid: int | None, thread: int) -> float:
    """CPU seconds (user + system) a thread of process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/task/{thread}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _streams(port: int, concurrency: int, n: int) -> None:
    """``concurrency`` streamed completions of ``n`` tokens at once, read to the end."""
    import aiohttp

    body = {"prompt": "Hello there", "max_tokens": n, "stream": True}
    url = f"http://127.0.0.1:{port}/v1/completions"

    async def one(session: aiohttp.ClientSession) -> None:
        async with session.post(url, json=body) as reply:
            events = [line async for line in reply.content if line.startswith(b"data: ")]
            if reply.status != 200 or len(events) != n + 2:
                raise RuntimeError(f"streamed completion failed: {reply.status}, {events[:2]}")

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session) for _ in range(concurrency)))
