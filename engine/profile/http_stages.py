"""The HTTP side's CPU costs, timed through the real frontend application.

The app of ``engine serve`` (``create_app``: routes, ``Frontend``, metrics,
SSE) runs in this process behind Starlette's in-process test client; this
module plays the rest of the pipeline on the app's own ZeroMQ sockets: it
pulls each ``GenerateRequest`` where the tokenizer worker would, and pushes
``TextBatch`` messages of one token each where the detokenizer would. A
streamed ``/v1/completions`` request of N tokens then costs

    t(N) = frontend + N * stream

fitted by least squares over several N: ``frontend`` in seconds per request
(parse, validate, submit, open the stream) and ``stream`` in seconds per
streamed chunk (receive, metrics, SSE event). Client-side work is included, so
both are upper bounds.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time

import numpy as np
import zmq

from engine import messages
from engine.launch.config import ServeConfig
from engine.profile.cpu_stages import StageCost

TOKEN_COUNTS = (1, 16, 64, 256)


def _pipeline(cfg: ServeConfig, stop: threading.Event) -> None:
    """Answer each request with ``max_new_tokens`` one-token text items."""
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(cfg.tokenizer_addr(0))
    out = ctx.socket(zmq.PUSH)
    out.connect(cfg.frontend_addr)
    try:
        while not stop.is_set():
            if not inbox.poll(50):
                continue
            req = messages.decode(inbox.recv())
            if not isinstance(req, messages.GenerateRequest):
                continue
            n = req.sampling.max_new_tokens
            for i in range(n):
                item = messages.TextItem(
                    rid=req.rid,
                    text=" a",
                    token_ids=[i],
                    token_times=[time.time()],
                    finish_reason="length" if i == n - 1 else None,
                    prompt_tokens=1 if i == 0 else 0,
                )
                out.send(messages.encode(messages.TextBatch(items=[item])))
    finally:
        inbox.close(linger=0)
        out.close(linger=0)
        ctx.term()


def measure_http(repeats: int) -> tuple[StageCost, StageCost]:
    """``frontend`` (per request) and ``stream`` (per chunk) costs."""
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
        thread = threading.Thread(target=_pipeline, args=(cfg, stop), daemon=True)
        thread.start()
        fits: list[tuple[float, float]] = []
        try:
            with TestClient(create_app(cfg, health=lambda: None)) as client:

                def request(n: int) -> None:
                    body = {"prompt": "Hello there", "max_tokens": n, "stream": True}
                    reply = client.post("/v1/completions", json=body)
                    if reply.status_code != 200 or reply.text.count("data: ") != n + 2:
                        raise RuntimeError(f"streamed completion failed: {reply.text[:200]}")

                for n in TOKEN_COUNTS:
                    request(n)  # warm up
                for _ in range(repeats):
                    times = []
                    for n in TOKEN_COUNTS:
                        start = time.perf_counter()
                        request(n)
                        times.append(time.perf_counter() - start)
                    x = np.array([[1.0, n] for n in TOKEN_COUNTS])
                    (per_request, per_chunk), *_ = np.linalg.lstsq(x, np.array(times), rcond=None)
                    fits.append((max(float(per_request), 0.0), max(float(per_chunk), 0.0)))
        finally:
            stop.set()
            thread.join()
    return (
        StageCost.of("frontend", [f[0] for f in fits]),
        StageCost.of("stream", [f[1] for f in fits]),
    )
