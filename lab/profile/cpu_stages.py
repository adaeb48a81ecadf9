"""CPU stage costs, each timed with the engine's own code on this machine.

- ``tokenize``: the tokenizer worker's work on one text prompt (decode the
  message, ``engine.tokenizer.worker.tokenize``, encode the ``TokenizedRequest``)
  for prompts as ``engine bench`` makes them (1024 tokens of one-token words), a
  new prompt each call so that no call finds the words of the one before in the
  tokenizer's cache; seconds per input token. These prompts tokenize about 1.4x
  slower per token than English prose on the machines measured here. Each call
  comes after ``TOKENIZE_IDLE_S`` of idling, as a serving worker meets a request
  between arrivals: called back to back the same work runs on warm caches (on the
  2-core development machine, 1,024 tokens: 2.1-2.6 ms back to back, 2.9-3.0 ms
  after 0.1 s idle, 4.3 ms inside a live server; 2.7 against 7.0 ms while other
  processes compete for the cores).
- ``tokenize_busy_N``: the same work back to back, as a worker with a queue does it, on
  new ``BUSY_TOKENS``-token prompts, with N worker processes tokenizing at once (N of
  ``CpuCosts.BUSY_WORKERS`` up to this machine's cores); seconds per input token. On the
  2-core development machine one worker runs 1.8-2.0 us a token back to back on 8k- and
  16k-token prompts where the idle ``tokenize`` row says 3.5-5.0, and a serving worker with
  a queue runs at 1.7-2.0: priced at the idle rate, a saturated tokenizer is half as fast
  as it is.
- ``detokenize``: the detokenizer process's work on one scheduler step's
  ``TokenBatch`` of 32 one-token items: decode the message, ``Detokenizer.process``
  (incremental decode, stop strings), encode the ``TextBatch``; seconds per token.
- ``ipc``: a ``TokenizedRequest`` of 1024 ids encoded, sent over a ZeroMQ
  PUSH/PULL ``ipc://`` socket to another process and echoed back; half the
  round trip, seconds per message hop.
- ``schedule`` / ``schedule_request``: ``StepDriver.step`` with a model that
  answers at once (``schedule``, the step's inputs, ``complete``, the token
  items) over pure-decode batches of 1 to 256 requests, fitted as seconds per
  step plus seconds per request in the batch.

``frontend`` and ``stream`` (the HTTP side) are in ``lab.profile.http_stages``.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.sampling.params import SamplingParams


@dataclass(frozen=True, slots=True)
class StageCost:
    """A per-unit cost: the median and the range over repeats."""

    kind: str
    median: float
    low: float
    high: float
    repeats: int

    @staticmethod
    def of(kind: str, per_unit: Sequence[float]) -> StageCost:
        return StageCost(kind, statistics.median(per_unit), min(per_unit), max(per_unit),
                         len(per_unit))  # fmt: skip


def repeat_times(fn: Callable[[], object], repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` calls, after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


TOKENIZE_IDLE_S = 0.1
"""Idle time before each timed tokenization (a worker between requests at ~10 requests/s)."""
BUSY_TOKENS = 8192
"""Prompt length of the back-to-back (``tokenize_busy_N``) timings (at most half the context)."""
BUSY_SECONDS = 1.0
"""Each worker of a ``tokenize_busy_N`` timing tokenizes back to back at least this long."""
BUSY_TIMEOUT_S = 300.0


def _payloads(tokenizer: Any, count: int, tokens: int) -> list[bytes]:
    """``count`` encoded ``GenerateRequest`` messages of new ``tokens``-token prompts."""
    from lab.bench.prompts import PromptMaker, fresh_salt
    from schema.traces import TraceRequest

    maker = PromptMaker(tokenizer, fresh_salt())
    return [
        messages.encode(
            messages.GenerateRequest(
                sampling=SamplingParams(),
                rid="p",
                received=0.0,
                text=maker.text(TraceRequest(str(i), 0.0, input_length=tokens, output_length=1)),
            )
        )
        for i in range(count)
    ]


def _tokenize_once(tokenizer: Any, cfg: ServeConfig, data: bytes) -> float:
    """The worker's work on one message (decode, tokenize, encode): seconds per token."""
    from engine.tokenizer.worker import tokenize

    start = time.perf_counter()
    req = messages.decode(data)
    assert isinstance(req, messages.GenerateRequest)
    out = messages.encode(tokenize(tokenizer, req, cfg))
    elapsed = time.perf_counter() - start
    tokenized = messages.decode(out)
    assert isinstance(tokenized, messages.TokenizedRequest)
    return elapsed / len(tokenized.input_ids)


def measure_tokenize(
    tokenizer: Any, cfg: ServeConfig, repeats: int, tokens: int = 1024
) -> StageCost:
    per_token = []
    for i, data in enumerate(_payloads(tokenizer, repeats + 1, tokens)):
        time.sleep(TOKENIZE_IDLE_S)
        cost = _tokenize_once(tokenizer, cfg, data)
        if i:  # the first call warms up
            per_token.append(cost)
    return StageCost.of("tokenize", per_token)


def _busy_worker(cfg: ServeConfig, payloads: list[bytes], start: Any, out: Any) -> None:
    """A spawned tokenizer: one warm-up call, then (with the others) the rest back to back,
    in turn, for at least ``BUSY_SECONDS``."""
    from engine.tokenizer.prompt import load_tokenizer

    try:
        tokenizer = load_tokenizer(cfg.tokenizer_path)
        _tokenize_once(tokenizer, cfg, payloads[0])
    except Exception as e:  # the parent raises it with its reason
        start.abort()
        out.put(f"{type(e).__name__}: {e}")
        return
    start.wait()
    costs: list[float] = []
    until = time.perf_counter() + BUSY_SECONDS
    while len(costs) < len(payloads) - 1 or time.perf_counter() < until:
        costs.append(_tokenize_once(tokenizer, cfg, payloads[1 + len(costs) % (len(payloads) - 1)]))
    out.put(costs)


def measure_tokenize_busy(
    tokenizer: Any, cfg: ServeConfig, repeats: int, tokens: int = BUSY_TOKENS
) -> list[StageCost]:
    """``tokenize_busy_N`` for each N of ``CpuCosts.BUSY_WORKERS`` up to the cores: N spawned
    workers (the server's tokenizer) start together and each tokenizes ``repeats`` new
    prompts (at most half the model's context) back to back, in turn, for at least
    ``BUSY_SECONDS`` (a rate over a few calls swings with the CPU's clock); the median over
    all their calls."""
    from sim.costs.base import CpuCosts

    tokens = min(tokens, cfg.max_model_len // 2)
    ctx = mp.get_context("spawn")
    costs = []
    for n in (n for n in CpuCosts.BUSY_WORKERS if n <= (os.cpu_count() or 1)):
        start, out = ctx.Barrier(n), ctx.Queue()
        procs = [
            ctx.Process(
                target=_busy_worker,
                args=(cfg, _payloads(tokenizer, repeats + 1, tokens), start, out),
                daemon=True,
            )
            for _ in range(n)
        ]
        for p in procs:
            p.start()
        try:
            per_token = [c for _ in procs for c in _get(out, procs)]
        finally:
            for p in procs:
                p.join(timeout=5)
                if p.is_alive():
                    p.kill()
        costs.append(StageCost.of(f"tokenize_busy_{n}", per_token))
    return costs


def _get(out: Any, procs: list[Any]) -> list[float]:
    """A worker's result; a clear error if a worker failed, died or hung."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            result: list[float] | str = out.get(timeout=0.5)
        except queue.Empty:
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a busy tokenizer worker died (exit {dead[0]})") from None
            continue
        if isinstance(result, str):
            raise RuntimeError(f"a busy tokenizer worker failed: {result}")
        return result
    raise RuntimeError(f"the busy tokenizer timing got no result in {BUSY_TIMEOUT_S:g} s")


def measure_detokenize(tokenizer: Any, ids: list[int], repeats: int, batch: int = 32) -> StageCost:
    from engine.detokenizer.process import Detokenizer

    steps = len(ids)
    payloads = [
        messages.encode(
            messages.TokenBatch(
                items=[
                    messages.TokenItem(
                        rid=f"r{r}", token_ids=[ids[(s + r) % len(ids)]], token_times=[0.0]
                    )
                    for r in range(batch)
                ]
            )
        )
        for s in range(steps)
    ]

    def run() -> None:
        detok = Detokenizer(tokenizer)
        for data in payloads:
            msg = messages.decode(data)
            assert isinstance(msg, messages.TokenBatch)
            items, _ = detok.process(msg)
            messages.encode(messages.TextBatch(items=items))

    return StageCost.of("detokenize", [t / (steps * batch) for t in repeat_times(run, repeats)])


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


def measure_ipc(ids: list[int], repeats: int, count: int = 500) -> StageCost:
    import zmq

    msg = messages.TokenizedRequest(
        rid="p", input_ids=ids, sampling=SamplingParams(), received=0.0, tokenized=0.0
    )
    total = (count + 50) * repeats
    hops: list[float] = []
    with tempfile.TemporaryDirectory() as d:
        there, back = f"ipc://{d}/there", f"ipc://{d}/back"
        ctx = zmq.Context()
        pull = ctx.socket(zmq.PULL)
        pull.bind(back)
        proc = mp.get_context("spawn").Process(target=_echo, args=(there, back, total))
        proc.start()
        push = ctx.socket(zmq.PUSH)
        push.connect(there)
        for _ in range(repeats):
            times = []
            for i in range(count + 50):
                start = time.perf_counter()
                push.send(messages.encode(msg))
                messages.decode(pull.recv())
                if i >= 50:
                    times.append(time.perf_counter() - start)
            hops.append(statistics.median(times) / 2)
        proc.join()
        push.close()
        pull.close()
        ctx.term()
    return StageCost.of("ipc", hops)


def _decoding_engine(batch: int) -> Any:
    """An ``StepDriver`` whose ``batch`` requests are all decoding, with a model that answers at
    once."""
    import torch

    from core.scheduler import SchedulerConfig
    from engine.runner.step import StepHandle
    from engine.scheduler_proc.driver import StepDriver

    def instant(plan: Any, inputs: Any) -> StepHandle:
        return StepHandle(torch.full((len(plan.sampling_rids()),), 7))

    engine = StepDriver(SchedulerConfig(num_pages=100_000, max_running=256), instant, [0])
    params = SamplingParams(max_new_tokens=1 << 20, ignore_eos=True)
    for i in range(batch):
        ids = [(i * 997 + j) % 30_000 + 1 for j in range(1000)]
        engine.add(messages.TokenizedRequest(f"r{i}", ids, params, 0.0, 0.0))
    while engine.core.num_waiting or any(r.num_output == 0 for r in engine.tracked.values()):
        engine.step()
    return engine


def measure_schedule(repeats: int, steps: int = 100) -> tuple[StageCost, StageCost, str]:
    """Per-step and per-request costs (least squares over batch sizes), and the points."""
    batches = (1, 8, 32, 64, 128, 256)
    fits: list[tuple[float, float]] = []
    per_batch: dict[int, list[float]] = {b: [] for b in batches}
    for _ in range(repeats):
        points = []
        for batch in batches:
            engine = _decoding_engine(batch)
            start = time.perf_counter()
            for _ in range(steps):
                engine.step()
            points.append((time.perf_counter() - start) / steps)
        x = np.array([[1.0, b] for b in batches])
        (per_step, per_request), *_ = np.linalg.lstsq(x, np.array(points), rcond=None)
        fits.append((max(float(per_step), 0.0), max(float(per_request), 0.0)))
        for b, t in zip(batches, points, strict=True):
            per_batch[b].append(t)
    what = ",".join(f"{b}:{statistics.median(t) * 1e6:.1f}us" for b, t in per_batch.items())
    return (
        StageCost.of("schedule", [f[0] for f in fits]),
        StageCost.of("schedule_request", [f[1] for f in fits]),
        what,
    )
