"""The HTTP side's CPU costs, timed through the real frontend application.

The app of ``engine serve`` (``create_app``: routes, ``Frontend``, metrics,
SSE) runs in this process behind Starlette's in-process test client; this
module plays the rest of the pipeline on the app's own ZeroMQ sockets: it
pulls each ``GenerateRequest`` where the tokenizer worker would, and pushes
``TextBatch`` messages where the detokenizer would, as the detokenizer does
under load: one batch per model step, with one text item for every request
that is streaming. ``C`` concurrent streamed ``/v1/completions`` requests of
N tokens each then cost

    t(C, N) = C * frontend + C * N * stream

of CPU time in the thread that runs the app's event loop, fitted by least
squares over several N: ``frontend`` in seconds per request (parse, validate,
submit, open the stream) and ``stream`` in seconds per streamed chunk
(receive, metrics, SSE event), with C = ``CONCURRENCY``. The clients run in
other threads, so their work is not counted, as it is not in the server of a
real deployment.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import zmq

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from lab.profile.cpu_stages import StageCost

TOKEN_COUNTS = (1, 16, 64, 128)
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
    from fastapi.testclient import TestClient

    from engine.server.app import create_app

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = ServeConfig(
            model="profile",
            model_path="profile",
            tokenizer_path="",
            vocab_size=1 << 16,
            run_dir=run_dir,
            parent_pid=os.getpid(),
            max_model_len=1 << 20,
        )
        stop = threading.Event()
        thread = threading.Thread(target=_pipeline, args=(cfg, stop, concurrency), daemon=True)
        thread.start()
        fits: list[tuple[float, float]] = []
        try:
            with TestClient(create_app(cfg, health=lambda: None)) as client:

                def request(n: int) -> None:
                    body = {"prompt": "Hello there", "max_tokens": n, "stream": True}
                    reply = client.post("/v1/completions", json=body)
                    if reply.status_code != 200 or reply.text.count("data: ") != n + 2:
                        raise RuntimeError(f"streamed completion failed: {reply.text[:200]}")

                assert client.portal is not None  # set while the client is open
                loop_thread = client.portal.call(threading.get_ident)
                clock = time.pthread_getcpuclockid(loop_thread)
                with ThreadPoolExecutor(concurrency) as pool:

                    def together(n: int) -> float:
                        start = time.clock_gettime(clock)
                        for done in [pool.submit(request, n) for _ in range(concurrency)]:
                            done.result()
                        return time.clock_gettime(clock) - start

                    for n in TOKEN_COUNTS:
                        together(n)  # warm up
                    for _ in range(repeats):
                        times = [together(n) / concurrency for n in TOKEN_COUNTS]
                        x = np.array([[1.0, n] for n in TOKEN_COUNTS])
                        (per_request, per_chunk), *_ = np.linalg.lstsq(
                            x, np.array(times), rcond=None
                        )
                        fits.append((max(float(per_request), 0.0), max(float(per_chunk), 0.0)))
        finally:
            stop.set()
            thread.join()
    return (
        StageCost.of("frontend", [f[0] for f in fits]),
        StageCost.of("stream", [f[1] for f in fits]),
    )
