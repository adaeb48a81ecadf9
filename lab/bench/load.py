"""The load generator: send a trace's requests at its arrival times and collect the records."""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from dataclasses import dataclass

import aiohttp
from tqdm import tqdm

from engine.ipc.heap import freeze_heap
from lab.bench.client import RequestRecord, Target, send
from lab.bench.server import ServerError
from schema.traces.record import Trace, TraceRequest

READ_BUFFER = 1 << 24
"""The stream's buffer; a line may take twice as many bytes (aiohttp's default lets 512 KiB,
and a final chunk's ``meta_info`` carries every token's time)."""


@dataclass(frozen=True, slots=True)
class BenchRun:
    """Records in trace order; ``epoch0`` is the wall-clock time (``time.time()``) of the
    benchmark clock's zero, which maps server timestamps onto it; ``gc_frozen`` the objects
    frozen out of garbage collection for the measured part (0: not frozen)."""

    records: list[RequestRecord]
    epoch0: float
    wall_s: float
    max_send_lag_s: float
    gc_frozen: int


async def warm_up(client: aiohttp.ClientSession, target: Target, prompts: list[str]) -> None:
    """One short request per prompt, one after the other, before the clock starts (not
    recorded); an error here means the server cannot be benchmarked. Then ``POST
    /flush_router``, so that a router in front of replicas (``engine serve --dp N``,
    ``engine router``) starts the run without the warm-up's prompts (or an earlier run's)
    in its prefix trees, as the simulated one does."""
    for i, prompt in enumerate(prompts):
        req = TraceRequest(rid=f"warmup-{i}", arrival=0.0, input_length=0, output_length=4)
        record = await send(client, target, req, prompt, time.perf_counter())
        if record.status != "completed":
            raise ServerError(f"{target.url}: the warm-up request failed: {record.reason}")
    if prompts:  # a router in front of replicas forgets the warm-up (404 elsewhere: nothing to do)
        async with client.post(f"{target.url}/flush_router", headers=target.headers()) as reply:
            await reply.read()


async def replay(
    trace: Trace,
    target: Target,
    prompts: list[str],
    warmup: list[str],
    progress: bool = True,
    gc_freeze: bool = True,
) -> BenchRun:
    """Send request i at ``trace.requests[i].arrival`` seconds after the start (never
    earlier; the largest delay is ``max_send_lag_s``), each on its own connection, after
    one untimed request per ``warmup`` prompt (prompts no measured request shares). With
    ``gc_freeze`` the heap is frozen out of garbage collection after the warm-up
    (``engine.ipc.heap``), so that no full collection stalls the event loop mid-run, and
    unfrozen at the end."""
    connector = aiohttp.TCPConnector(limit=0)  # a connection per open request, no cap
    timeout = aiohttp.ClientTimeout(total=None, connect=60.0)
    bar = tqdm(total=len(trace.requests), unit="req", desc="bench", file=sys.stderr,
               disable=not progress, mininterval=1.0)  # fmt: skip
    session = aiohttp.ClientSession(connector=connector, timeout=timeout, read_bufsize=READ_BUFFER)
    async with session as client:
        await warm_up(client, target, warmup)
        frozen = freeze_heap() if gc_freeze else 0
        try:
            clock0, epoch0 = time.perf_counter(), time.time()
            tasks = []
            for req, prompt in zip(trace.requests, prompts, strict=True):
                delay = req.arrival - (time.perf_counter() - clock0)
                if delay > 0:
                    await asyncio.sleep(delay)
                task = asyncio.create_task(send(client, target, req, prompt, clock0))
                task.add_done_callback(lambda _: bar.update(1))
                tasks.append(task)
            records = list(await asyncio.gather(*tasks))
            wall_s = time.perf_counter() - clock0
        finally:
            if frozen:
                gc.unfreeze()
    bar.close()
    lag = max((r.sent - r.scheduled for r in records), default=0.0)
    return BenchRun(records, epoch0, wall_s, lag, frozen)
