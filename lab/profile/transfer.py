"""Time prefill/decode disaggregation's KV transfer on the serving runner's pool: the
profile's transfer rows.

A ``KVSender`` pushes ``n`` pages of the pool to a ``KVReceiver`` bound at
``tcp://127.0.0.1:*`` (as a decode server binds ``tcp://{pd_host}:*``), which scatters
them into other pages of the pool, for several ``n``. Each transfer is timed from ``send``
until the sender's ``poll`` returns the acknowledgment, both ends polled in one tight loop;
a least-squares line through the median times gives (``sim.costs.transfer``)::

    kv_transfer        fixed time of a transfer (connect, header, acknowledgment)
    kv_transfer_token  time per KV token (gather, wire, scatter)

Both ends run on this thread, so the rows are the mechanism's own cost: in serving they are
two processes, each polling between its steps, and a transfer also waits for those polls.
The destination is the back of the same pool, not a second pool, because on an
accelerator the serving pool takes the memory a second one would need; source pages come
from the front, so no transfer reads a page it writes. On an accelerator the pages stage
through host memory each way, as in serving.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from engine.kvcache.transfer import KVReceiver, KVSender
from engine.kvcache.transfer_wire import TransferResult, page_bytes
from engine.runner.model_runner import ModelRunner
from lab.profile.copies import fit_line
from sim.costs.profile import EMPTY_SHAPE, TRANSFER_KINDS, ProfileRow

PAGE_COUNTS = (1, 4, 16, 64, 256)
ADDRESS = "tcp://127.0.0.1:*"
TIMEOUT_S = 30.0


def measure_transfer(runner: ModelRunner, repeats: int, info: dict[str, str]) -> list[ProfileRow]:
    """The two transfer rows, from transfers of up to ``PAGE_COUNTS[-1]`` pages (at most half
    the pool); notes what was timed in ``info``. No rows for a runner of several ranks, whose
    pool is a shard (disaggregation moves a ``--tp 1`` pool), or for a pool of one page."""
    if runner.tp.size > 1:
        info["transfer"] = f"not measured: disaggregation needs --tp 1, not {runner.tp.size}"
        return []
    counts = [n for n in PAGE_COUNTS if 2 * n <= runner.num_pages]
    if not counts:
        info["transfer"] = f"not measured: a pool of {runner.num_pages} page, two needed"
        return []
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    with KVSender(TIMEOUT_S) as sender, KVReceiver(ADDRESS, runner.kv) as receiver:
        times = [_median(sender, receiver, n, repeats, sync) for n in counts]
    medians = ",".join(f"{n}:{t * 1e3:.2f}ms" for n, t in zip(counts, times, strict=True))
    info["transfer"] = (
        f"KVSender to KVReceiver over {ADDRESS.removesuffix(':*')}, both in one process, "
        f"pages of {runner.page_size} tokens ({page_bytes(runner.kv)} B a page) into other "
        f"pages of the pool, from send to the acknowledgment, median of {repeats}, fitted as "
        f"fixed + per token over pages {medians}"
    )
    return transfer_rows(counts, times, runner.page_size, repeats)


def transfer_rows(
    counts: list[int], times: list[float], page_size: int, repeats: int
) -> list[ProfileRow]:
    """The rows of the least-squares line through (pages, seconds): its intercept, clipped at
    zero, as the fixed time and its slope per KV token (pages of ``page_size`` tokens)."""
    per_page, fixed = fit_line(counts, times)
    values = (max(fixed, 0.0), per_page / page_size)
    return [
        ProfileRow(kind, EMPTY_SHAPE, 1, value, value, value, repeats)
        for kind, value in zip(TRANSFER_KINDS, values, strict=True)
    ]


def _median(
    sender: KVSender, receiver: KVReceiver, n: int, repeats: int, sync: Callable[[], None]
) -> float:
    """Median time of ``repeats`` transfers of ``n`` pages, after one untimed."""
    pool = receiver.pool
    source = list(range(n))
    destination = list(range(pool.num_pages - n, pool.num_pages))
    times = []
    for attempt in range(repeats + 1):
        transfer_id = f"profile-{n}-{attempt}"
        receiver.expect(transfer_id, destination)  # the decode side reserves first
        sync()
        start = time.perf_counter()
        sender.send(receiver.address, transfer_id, pool, source)
        result = _acknowledged(sender, receiver)
        sync()  # the scatter's copies on an accelerator
        times.append(time.perf_counter() - start)
        if not result.ok:
            raise RuntimeError(f"transfer of {n} pages: {result.status}: {result.detail}")
    return statistics.median(times[1:])


def _acknowledged(sender: KVSender, receiver: KVReceiver) -> TransferResult:
    """The end of the one transfer in flight, the receiver scattering as it arrives."""
    while True:
        receiver.poll()
        results = sender.poll()
        if results:
            return results[0]
