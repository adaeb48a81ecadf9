"""Measure the CPU costs of the serving pipeline's stages and write them as a profile.

Each stage is timed with the engine's own code path on this machine:

- ``tokenize``: the SmolLM2 tokenizer (transformers fast tokenizer, as the
  engine's tokenizer worker loads it) encoding English prose through
  ``engine.tokenizer.prompt.prompt_ids``; seconds per input token.
- ``detokenize``: ``engine.detokenizer.incremental.IncrementalDecoder.push`` one
  token at a time (what the detokenizer does per streamed token); seconds per token.
- ``ipc``: a ``TokenizedRequest`` (1024 token ids) encoded with the engine's
  msgpack messages, sent over a ZeroMQ PUSH/PULL ``ipc://`` socket to another
  process and echoed back; half the round trip, seconds per message hop.
- ``frontend``: one POST of an OpenAI chat body through a FastAPI app (ASGI
  TestClient, no sockets) that parses it into a ``GenerateRequest``; seconds per
  request (client side included, so an upper bound).
- ``schedule`` / ``schedule_request``: the real scheduler core's
  ``schedule(now)`` + ``complete(plan, None)`` for pure-decode batches of 1 to
  256 requests, fitted as seconds per step + seconds per request in the batch.

Usage: ``python scripts/measure_cpu_costs.py --model-dir DIR --out profiles/cpu_costs.csv``
"""

from __future__ import annotations

import argparse
import datetime as dt
import multiprocessing as mp
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROSE = [
    ROOT / "traces" / "LICENSE-azure-CC-BY-4.0",
    ROOT / "traces" / "LICENSE-mooncake-Apache-2.0",
]


def _median_time(fn: Callable[[], object], repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure_tokenize(tokenizer: object, text: str) -> float:
    from engine.messages import GenerateRequest
    from engine.sampling.params import SamplingParams
    from engine.tokenizer.prompt import prompt_ids

    req = GenerateRequest(rid="m", sampling=SamplingParams(), received=0.0, text=text)
    n = len(prompt_ids(tokenizer, req, 1 << 30))
    return _median_time(lambda: prompt_ids(tokenizer, req, 1 << 30), 20) / n


def measure_detokenize(tokenizer: object, ids: list[int]) -> float:
    from engine.detokenizer.incremental import IncrementalDecoder

    def run() -> None:
        dec = IncrementalDecoder(tokenizer)
        for i in ids:
            dec.push([i])

    return _median_time(run, 5) / len(ids)


def _echo(address: str, back: str, count: int) -> None:
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(address)
    push = ctx.socket(zmq.PUSH)
    push.connect(back)
    for _ in range(count):
        push.send(pull.recv())
    push.close(linger=1000)
    pull.close()


def measure_ipc(ids: list[int], count: int = 2000) -> float:
    import zmq

    from engine import messages
    from engine.sampling.params import SamplingParams

    msg = messages.TokenizedRequest(
        rid="m", input_ids=ids, sampling=SamplingParams(), received=0.0, tokenized=0.0
    )
    with tempfile.TemporaryDirectory() as d:
        there, back = f"ipc://{d}/there", f"ipc://{d}/back"
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(back)
        proc = mp.get_context("spawn").Process(target=_echo, args=(there, back, count + 50))
        proc.start()
        push = ctx.socket(zmq.PUSH)
        push.connect(there)
        times = []
        for i in range(count + 50):
            t0 = time.perf_counter()
            push.send(messages.encode(msg))
            messages.decode(pull.recv())
            if i >= 50:
                times.append(time.perf_counter() - t0)
        proc.join()
        push.close()
        pull.close()
    return statistics.median(times) / 2


def measure_frontend(count: int = 300) -> float:
    import msgspec
    from fastapi import FastAPI, Request
    from fastapi.testclient import TestClient

    from engine.messages import ChatMessage, GenerateRequest
    from engine.sampling.params import SamplingParams

    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, str]:
        body = msgspec.json.decode(await request.body())
        req = GenerateRequest(
            rid="m",
            sampling=SamplingParams(max_new_tokens=body.get("max_tokens", 128)),
            received=time.time(),
            messages=[ChatMessage(m["role"], m["content"]) for m in body["messages"]],
        )
        return {"rid": req.rid}

    body = {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "hi " * 300}]}
    with TestClient(app) as client:
        return _median_time(lambda: client.post("/v1/chat/completions", json=body), count)


def measure_schedule() -> tuple[float, float, list[tuple[int, float]]]:
    from engine.scheduler import Request, Scheduler, SchedulerConfig

    points: list[tuple[int, float]] = []
    for batch in (1, 8, 32, 64, 128, 256):
        s = Scheduler(SchedulerConfig(num_pages=200_000, max_running=256, prefix_cache=True))
        for i in range(batch):
            s.add(
                Request(
                    rid=f"r{i}",
                    prompt_len=1000,
                    max_new_tokens=100_000,
                    block_hashes=list(range(i * 2, i * 2 + 2)),
                    block_size=512,
                )
            )
        while any(True for _ in s.waiting()) or any(
            r.status.value != "decoding" for r in s.running.values()
        ):
            s.complete(s.schedule(0.0), None)
        steps = 200
        t0 = time.perf_counter()
        for _ in range(steps):
            s.complete(s.schedule(0.0), None)
        points.append((batch, (time.perf_counter() - t0) / steps))
    x = np.array([[1.0, b] for b, _ in points])
    y = np.array([t for _, t in points])
    (per_step, per_request), *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(per_step), float(per_request), points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model-dir", type=Path, default=Path.home() / ".cache/servelab/models/smollm2-135m"
    )
    parser.add_argument("--out", type=Path, default=ROOT / "profiles" / "cpu_costs.csv")
    args = parser.parse_args()

    from engine.tokenizer.prompt import load_tokenizer

    tokenizer = load_tokenizer(str(args.model_dir))
    text = "\n".join(p.read_text(encoding="utf-8") for p in PROSE)
    chunk = text[:4000]
    ids = list(tokenizer.encode(text[:20000], add_special_tokens=False))[:1024]
    costs = {
        "tokenize": measure_tokenize(tokenizer, chunk),
        "detokenize": measure_detokenize(tokenizer, ids[:512]),
        "ipc": measure_ipc(ids),
        "frontend": measure_frontend(),
    }
    per_step, per_request, points = measure_schedule()
    costs["schedule"] = max(per_step, 0.0)
    costs["schedule_request"] = max(per_request, 0.0)
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    header = [
        f"# hardware: {cpu}, {mp.cpu_count()} cores (shared), Python {platform.python_version()}",
        f"# model: SmolLM2-135M-Instruct tokenizer ({args.model_dir.name}); scheduler core",
        f"# date: {dt.datetime.now(dt.UTC).isoformat(timespec='seconds')}",
        "# command: .venv/bin/python scripts/measure_cpu_costs.py",
        "# what: "
        + "; ".join(
            [
                "tokenize = engine prompt_ids per token (4000 chars of license prose)",
                "detokenize = IncrementalDecoder.push per token",
                "ipc = half a ZeroMQ ipc:// round trip of a 1024-id TokenizedRequest",
                "frontend = FastAPI TestClient POST of a chat body",
                "schedule(+_request) = Scheduler.schedule+complete fit over decode batch "
                + ",".join(f"{b}:{t * 1e6:.1f}us" for b, t in points),
            ]
        ),
        "kind,prefill_tokens,decode_requests,context_tokens,tp,duration_s",
    ]
    rows = [f"{k},0,0,0,1,{v:.6e}" for k, v in costs.items()]
    args.out.write_text("\n".join(header + rows) + "\n")
    print("\n".join(header + rows))


if __name__ == "__main__":
    main()
