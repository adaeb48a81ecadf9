"""How long an eager step holds the host, in the contexts serving launches it in.

Run on the GPU machine (after ``source scripts/gpu_env.sh``)::

    python3 benchmarks/gpu/launch_context.py --out $OUT/launch_context.json
    python3 benchmarks/gpu/launch_context.py --steps RECORD.csv   # a step record's launches

``engine profile`` times each plan's launch (the step record's ``launched - enqueued``) with
the same plan just run and the device idle; a server launches a newcomer's prefill after
graph-replayed decodes, behind a decode still on the device (overlap), or after the loop
idled, with its other processes busy on other cores. On one runner built as ``engine serve``
builds it (``--serve-args``), this times eager steps (a short and a long prefill, a chunk
beside 16 decodes) in each such context, with the time spent in each part of the launch
(layout, upload, attention metadata, FlashInfer's plan, the forward, sampling) and the
median CPU clock; ``--steps`` prints a step record's launch time per step shape (served steps,
to set beside these).
"""

from __future__ import annotations

import argparse
import collections
import csv
import json
import multiprocessing as mp
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.scheduler.plan import Plan
from engine.runner.device_step import DeviceStep
from engine.runner.step import StepHandle
from lab.profile.grid import StepPoint
from lab.profile.main import serve_config
from lab.profile.steps import StepTimer, serving_runner

EAGER = {
    "prefill32": StepPoint(((0, 32),), ()),
    "prefill512": StepPoint(((0, 512),), ()),
    "chunk256+16decodes": StepPoint(((0, 256),), (1024,) * 16),
}


class Phases:
    """Seconds spent in wrapped functions while ``on``, per name."""

    def __init__(self) -> None:
        self.on = False
        self.times: dict[str, list[float]] = collections.defaultdict(list)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.on:
                    self.times[name].append(time.perf_counter() - start)

        return timed


def _spin() -> None:
    while True:
        pass


@contextmanager
def busy(cores: int) -> Iterator[None]:
    """``cores`` processes spinning (other processes of a server at work) while inside."""
    procs = [mp.get_context("fork").Process(target=_spin, daemon=True) for _ in range(cores)]
    for p in procs:
        p.start()
    try:
        time.sleep(0.5 if procs else 0.0)
        yield
    finally:
        for p in procs:
            p.kill()
            p.join()


def cpu_mhz() -> float:
    """The median clock /proc/cpuinfo reports over the cores (NaN where it says none)."""
    with open("/proc/cpuinfo") as f:
        values = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
    return statistics.median(values) if values else float("nan")


def moved(plan: Plan, tag: str, first_page: int) -> Plan:
    """``plan`` with its rids tagged and its pages shifted by ``first_page``."""
    chunks = tuple(
        type(c)(c.rid + tag, c.start, c.length, c.samples, tuple(p + first_page for p in c.pages))
        for c in plan.prefill
    )
    slots = tuple(
        d._replace(rid=d.rid + tag, pages=tuple(p + first_page for p in d.pages))
        for d in plan.decode
    )
    return Plan(step=0, prefill=chunks, decode=slots)


class Contexts:
    """Launches of one eager plan, each after what serving may have done just before."""

    def __init__(self, timer: StepTimer, phases: Phases, decode: Plan, decode16: Plan) -> None:
        self.timer, self.phases = timer, phases
        self.decode, self.decode16 = decode, decode16

    def track(self, plan: Plan) -> None:
        for c in plan.prefill:
            self.timer._track(c.rid, c.start + c.length)
        for d in plan.decode:
            self.timer._track(d.rid, d.position + 1)

    def launch(self, plan: Plan, timed: bool = False) -> tuple[StepHandle, float]:
        driver = self.timer.engine
        self.phases.on = timed
        try:
            handle = driver.run_model(plan, driver.inputs(plan))
        finally:
            self.phases.on = False
        assert handle.enqueued is not None
        return handle, time.time() - handle.enqueued

    def after(self, plan: Plan, before: Callable[[], list[StepHandle]]) -> float:
        """The launch time of ``plan`` right after ``before`` ran (its handles unfinished)."""
        handles = before()
        handle, seconds = self.launch(plan, timed=True)
        for h in [*handles, handle]:
            h.result()
        return seconds

    def cases(self, plan: Plan) -> dict[str, Callable[[], float]]:
        def idle(s: float) -> Callable[[], float]:
            def sleep() -> list[StepHandle]:
                time.sleep(s)
                return []

            return lambda: self.after(plan, sleep)

        def graphs(n: int) -> list[StepHandle]:
            for _ in range(n):
                self.launch(self.decode)[0].result()
            return []

        return {
            "back_to_back": lambda: self.after(plan, lambda: [self.launch(plan)[0]]),
            "strict(profile)": lambda: self.after(plan, lambda: []),
            "after_idle_5ms": idle(0.005),
            "after_idle_100ms": idle(0.1),
            "after_8_graph_decodes": lambda: self.after(plan, lambda: graphs(8)),
            "behind_decode_in_flight": lambda: self.after(
                plan, lambda: [self.launch(self.decode)[0]]
            ),
            "behind_16_decodes_in_flight": lambda: self.after(
                plan, lambda: [self.launch(self.decode16)[0]]
            ),
        }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    cfg = serve_config(["--model", args.model, *args.serve_args.split()], tempfile.mkdtemp())
    results: dict[str, Any] = {}
    with serving_runner(cfg.runner) as leader:
        runner = leader.runner
        ps = runner.page_size
        timer = StepTimer(leader, ps, runner.num_pages, cfg.vocab_size)
        phases = Phases()
        # the launch's parts, timed where they are defined (the class's functions for the step)
        parts = [
            (runner.attention, "_before_plan", "wait_for_last_plan"),
            (runner.attention, "prepare", "attention_plan"),
            (DeviceStep, "upload", "upload"),
            (DeviceStep, "metadata", "metadata"),
            (runner, "_run_model", "forward"),
            (runner.sampler, "sample_tensor", "sample"),
        ]
        for owner, attr, label in parts:
            if hasattr(owner, attr):
                setattr(owner, attr, phases.wrap(label, getattr(owner, attr)))
        contexts = Contexts(
            timer,
            phases,
            moved(StepPoint((), (1024,)).plan(ps), "D", 0),
            moved(StepPoint((), (1024,) * 16).plan(ps), "E", 0),
        )
        contexts.track(contexts.decode)
        contexts.track(contexts.decode16)
        for name, point in EAGER.items():
            plan = moved(point.plan(ps), "P", args.first_page)
            contexts.track(plan)
            cases = contexts.cases(plan)
            strict = cases["strict(profile)"]
            for cores in args.busy:
                cases[f"strict_{cores}_cores_busy"] = strict
            for _ in range(2):
                strict()
            rows = {}
            for case, fn in cases.items():
                phases.times.clear()
                cores = int(case.split("_")[1]) if case.endswith("cores_busy") else 0
                with busy(cores):
                    mhz = cpu_mhz()
                    times = [fn() for _ in range(args.repeats)]
                rows[case] = {
                    "launch_ms": round(statistics.median(times) * 1e3, 3),
                    "min_ms": round(min(times) * 1e3, 3),
                    "cpu_mhz": mhz,
                    "parts_ms": {
                        k: round(statistics.median(v) * 1e3, 3) for k, v in phases.times.items()
                    },
                }
                print(name, case, json.dumps(rows[case]), flush=True)
            results[name] = rows
    return results


def record_launches(path: Path) -> dict[str, dict[str, float]]:
    """Median launch (``launched - enqueued``) and device time per step shape of a record."""
    kinds: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    with path.open() as f:
        for row in csv.DictReader(f):
            p, d = int(row["prefill_tokens"]), int(row["decode_requests"])
            kind = f"prefill{p}" if p and not d else (f"chunk{p}+{d}decodes" if p else f"decode{d}")
            device = float(row["device_ms"]) if row["device_ms"] else float("nan")
            kinds[kind].append(((float(row["launched"]) - float(row["enqueued"])) * 1e3, device))
    return {
        kind: {
            "steps": len(v),
            "launch_ms": statistics.median(x for x, _ in v),
            "device_ms": statistics.median(y for _, y in v),
        }
        for kind, v in sorted(kinds.items(), key=lambda kv: -len(kv[1]))
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument(
        "--serve-args", default="--dummy-weights --device cuda --tokenizer .gpu/tokenizer"
    )
    ap.add_argument("--repeats", type=int, default=10, help="launches per context (10)")
    ap.add_argument(
        "--busy", type=lambda t: [int(x) for x in t.split(",") if x], default=[4, 12],
        help="spinning processes beside the strict launch, per case (4,12; '' for none)",
    )  # fmt: skip
    ap.add_argument("--first-page", type=int, default=1200, help="the eager plans' first page")
    ap.add_argument("--steps", type=Path, help="print this step record's launches and exit")
    ap.add_argument("--out", type=Path, help="write the results as JSON")
    args = ap.parse_args(argv)
    if args.steps is not None:
        for kind, row in record_launches(args.steps).items():
            print(kind, json.dumps(row))
        return 0
    results = measure(args)
    if args.out is not None:
        payload = {"command": vars(args), "results": results}
        args.out.write_text(json.dumps(payload, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
