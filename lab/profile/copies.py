"""Time the host KV tier's copies on the serving runner's pool: the profile's copy rows.

``HostKVPool.run`` (the serving code path) copies ``n`` pages one way, for
several ``n``; a least-squares line through the median times gives a fixed
time per copy and a time per page, written per KV token (``sim.costs.copies``)::

    copy_h2d, copy_h2d_token   loads  (host slot -> device page)
    copy_d2h, copy_d2h_token   writes (device page -> host slot)
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from engine.kvcache.host_pool import HostKVPool
from engine.runner.model_runner import ModelRunner
from sim.costs.profile import EMPTY_SHAPE, ProfileRow

PAGE_COUNTS = (1, 4, 16, 64)


def measure_copies(runner: ModelRunner, repeats: int, info: dict[str, str]) -> list[ProfileRow]:
    """The four copy rows, from copies of up to ``PAGE_COUNTS[-1]`` pages (fewer on a small
    pool); notes what was timed in ``info``."""
    counts = [n for n in PAGE_COUNTS if n <= runner.num_pages] or [runner.num_pages]
    host = HostKVPool(runner.kv, counts[-1])
    sync = torch.cuda.synchronize if runner.device.type == "cuda" else (lambda: None)
    rows: list[ProfileRow] = []
    for kind, copies in (
        ("copy_h2d", lambda n: ([], [(i, i) for i in range(n)])),
        ("copy_d2h", lambda n: ([(i, i) for i in range(n)], [])),
    ):
        times = [_median(host, copies, n, repeats, sync) for n in counts]
        per_page, fixed = fit_line(counts, times)
        per_token = per_page / runner.page_size
        for name, value in ((kind, max(fixed, 0.0)), (f"{kind}_token", per_token)):
            rows.append(ProfileRow(name, EMPTY_SHAPE, runner.tp.size, value, value, value, repeats))
    info["copies"] = (
        f"HostKVPool.run of {','.join(map(str, counts))} pages of {runner.page_size} tokens "
        f"each way, median of {repeats}, fitted as fixed + per token"
    )
    return rows


Copies = Callable[[int], tuple[list[tuple[int, int]], list[tuple[int, int]]]]


def _median(
    host: HostKVPool, copies: Copies, n: int, repeats: int, sync: Callable[[], None]
) -> float:
    writes, loads = copies(n)
    host.run(writes, loads)  # warm-up
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        host.run(writes, loads)
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def fit_line(x: list[int], y: list[float]) -> tuple[float, float]:
    """(slope, intercept) of the least-squares line; a single point goes through the origin."""
    if len(x) == 1:
        return y[0] / x[0], 0.0
    slope, intercept = np.polyfit(np.asarray(x, dtype=float), np.asarray(y), 1)
    return float(slope), float(intercept)
