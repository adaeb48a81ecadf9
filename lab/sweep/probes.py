"""One replay of many: a probe (configuration + rate scale), its result row, cache and driver.

``sim sweep`` and ``sim capacity`` both turn their work into probes and hand
them to ``run_probes``, which skips probes whose row is cached, runs the rest
on an executor (``lab.sweep.executor``) with a progress bar, and caches each row
that succeeded.

A probe's cache key hashes everything its result depends on: the trace file's
bytes and ``--limit``, the rate scale, the whole resolved configuration, the
bytes of the profile files it names, and the simulator's own code and
committed profiles (``sim/``, ``engine/scheduler/``, ``profiles/``), so an
edit to any of them is a new key. Rows are deterministic: the same probe gives
the same row on any executor, fresh or cached.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from tqdm import tqdm

from lab.sweep.executor import Executor
from schema.traces import Trace, scale_trace
from sim.config import SimConfig

LATENCY_METRICS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms")
QUANTILES = ("mean", "p50", "p90", "p99")
METRIC_COLUMNS = (
    "num_requests", "completed", "rejected", "duration_s", "request_throughput",
    "output_throughput", "input_throughput", "goodput", "slo_attainment",
    *(f"{m}_{q}" for m in LATENCY_METRICS for q in QUANTILES),
    "prefix_hit_rate", "num_steps", "kv_pages", "engine_busy", "binding_limit",
    "dominant_ttft_stage",
)  # fmt: skip
"""The result columns of a row, after its knobs and before ``status``/``error``/``key``."""
SUMMARY_COLUMNS = METRIC_COLUMNS[:7]
"""Columns copied from ``summary.json`` as they are."""
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True, slots=True)
class Probe:
    """A replay to run: the configuration's fields and the rate scale; ``key`` names its row.

    ``error`` says why the knobs make no valid configuration; such a probe fails
    without running.
    """

    config: dict[str, Any]
    rate_scale: float
    key: str
    error: str = ""


def run_probe(trace: Trace, probe: Probe) -> dict[str, Any]:
    """The probe's row: its results, or ``status`` ``failed`` and the error (never raises)."""
    from lab.report.verdict import bottleneck_verdict
    from sim.replay import run_replay

    if probe.error:
        return failed_row(probe, probe.error)
    started = time.perf_counter()
    try:
        config = SimConfig.from_flat(**probe.config)
        result = run_replay(scale_trace(trace, probe.rate_scale), config, progress=False)
        s = result.summary
        limit = bottleneck_verdict(s, result.requests, result.steps, result.queues)
    except Exception as exc:
        last = traceback.extract_tb(exc.__traceback__)[-1]
        where = f" at {Path(last.filename).name}:{last.lineno}" if last else ""
        return failed_row(probe, f"{type(exc).__name__}: {exc}{where}")
    row: dict[str, Any] = {k: s[k] for k in SUMMARY_COLUMNS}
    row["goodput"] = s["goodput"]["value"]
    row["slo_attainment"] = s["goodput"]["attainment"]
    for m in LATENCY_METRICS:
        row.update({f"{m}_{q}": s[m][q] for q in QUANTILES})
    row.update(prefix_hit_rate=s["prefix_hit_rate"], num_steps=s["num_steps"])
    row.update(
        kv_pages=s["config"]["resolved_num_pages"],
        engine_busy=limit["evidence"]["busy_fraction"],
        binding_limit=limit["binding_limit"],
        dominant_ttft_stage=limit["dominant_ttft_stage"],
    )
    row.update(status="ok", error="", key=probe.key)
    row["wall_s"] = time.perf_counter() - started  # kept in the cache, not in result tables
    return row


def failed_row(probe: Probe, error: str) -> dict[str, Any]:
    return {**dict.fromkeys(METRIC_COLUMNS), "status": "failed", "error": error, "key": probe.key}


@cache
def code_fingerprint() -> str:
    """A hash of the simulator's code and committed profiles."""
    h = hashlib.sha256()
    for folder, pattern in (("sim", "*.py"), ("engine/scheduler", "*.py"), ("profiles", "*")):
        for path in sorted((ROOT / folder).rglob(pattern)):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(ROOT)).encode())
                h.update(path.read_bytes())
    return h.hexdigest()


def file_digest(path: Path | str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def probe_key(trace_digest: str, limit: int | None, config: SimConfig, rate_scale: float) -> str:
    """The cache key of a probe (see the module docstring)."""
    files = {p: file_digest(p) for p in (config.profile, config.cpu_profile) if p}
    inputs = {
        "trace": trace_digest,
        "limit": limit,
        "rate_scale": rate_scale,
        "config": config.to_dict(),
        "files": files,
        "code": code_fingerprint(),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()[:20]


class RowCache:
    """Rows of finished probes, one JSON file each under ``folder`` (None: no cache)."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = folder
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)

    def get(self, key: str) -> dict[str, Any] | None:
        if self.folder is None or not (self.folder / f"{key}.json").is_file():
            return None
        row: dict[str, Any] = json.loads((self.folder / f"{key}.json").read_text())
        return row

    def put(self, row: dict[str, Any]) -> None:
        """Store a successful row (atomically: a rerun never reads half a file)."""
        if self.folder is None or row["status"] != "ok":
            return
        path = self.folder / f"{row['key']}.json"
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(row, indent=1) + "\n")
        tmp.replace(path)


def run_probes(
    probes: Sequence[Probe],
    trace: Trace,
    executor: Executor,
    cache: RowCache,
    *,
    progress: bool = True,
    desc: str = "sweep",
) -> list[dict[str, Any]]:
    """Rows of ``probes`` in their order; cached rows are read back, the others run."""
    rows: list[dict[str, Any] | None] = [cache.get(p.key) for p in probes]
    todo = [i for i, row in enumerate(rows) if row is None]
    bar = tqdm(total=len(probes), desc=desc, unit="cfg", file=sys.stderr, disable=not progress)
    bar.update(len(probes) - len(todo))
    failed = 0
    crash: Callable[[Probe, str], dict[str, Any]] = failed_row
    for j, row in executor.run(run_probe, trace, [probes[i] for i in todo], crash):
        cache.put(row)
        rows[todo[j]] = row
        failed += row["status"] != "ok"
        bar.set_postfix(cached=len(probes) - len(todo), failed=failed, refresh=False)
        bar.update(1)
    bar.close()
    return [r for r in rows if r is not None]
