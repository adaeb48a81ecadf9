"""The closed-form front stages equal SimPy's FIFO resources, float for float."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import numpy as np
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from schema.traces.record import TraceRequest
from sim.costs.base import CpuCosts
from sim.model.frontend import front_times


def _simpy_front(
    requests: list[TraceRequest], cpu: CpuCosts, workers: int
) -> tuple[dict[str, list[float]], dict[str, list[tuple[float, int]]]]:
    """The stages as SimPy processes: a frontend loop, FIFO, and FIFO tokenizer workers dealt
    requests round-robin (as the frontend deals them)."""
    env = simpy.Environment()
    loop = simpy.Resource(env, 1)
    pool = [simpy.Resource(env, 1) for _ in range(workers)]
    finish = [-np.inf] * workers  # when each worker's current prompt is done
    times: dict[str, list[float]] = {k: [np.nan] * len(requests) for k in ("arrival", "parsed",
                                     "tokenize_start", "tokenized", "sched_arrival")}  # fmt: skip
    queues: dict[str, list[tuple[float, int]]] = {"frontend": [], "tokenizer": []}
    waiting = {"frontend": 0, "tokenizer": 0}

    def queue(grant: simpy.Event, stage: str) -> Generator[simpy.Event, Any, None]:
        if grant.triggered:
            yield grant
            return
        waiting[stage] += 1
        queues[stage].append((env.now, waiting[stage]))
        yield grant
        waiting[stage] -= 1
        queues[stage].append((env.now, waiting[stage]))

    def request(i: int, r: TraceRequest) -> Generator[simpy.Event, Any, None]:
        times["arrival"][i] = env.now
        grant = loop.request()
        yield from queue(grant, "frontend")
        yield env.timeout(cpu.frontend)
        loop.release(grant)
        times["parsed"][i] = env.now
        yield env.timeout(cpu.ipc)
        worker = pool[i % workers]
        slot = worker.request()
        queued = not slot.triggered
        yield from queue(slot, "tokenizer")
        times["tokenize_start"][i] = env.now
        # straight on from the prompt before: the rate of as many workers busy at once
        busy = sum(f > env.now for f in finish) + 1 if queued else 0
        finish[i % workers] = env.now + cpu.tokenize_time(r.input_length, busy)
        yield env.timeout(cpu.tokenize_time(r.input_length, busy))
        worker.release(slot)
        times["tokenized"][i] = env.now
        yield env.timeout(cpu.ipc)
        times["sched_arrival"][i] = env.now

    def arrivals() -> Generator[simpy.Event, Any, None]:
        for i, r in enumerate(requests):
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            env.process(request(i, r))

    env.process(arrivals())
    env.run()
    return times, queues


@settings(max_examples=60, deadline=None)
@given(
    gaps=st.lists(st.floats(0.0, 3e-3), min_size=1, max_size=40),
    lengths=st.lists(st.integers(0, 4000), min_size=40, max_size=40),
    workers=st.integers(1, 3),
    frontend=st.floats(1e-5, 2e-3),
)
def test_front_times_equal_simpy(
    gaps: list[float], lengths: list[int], workers: int, frontend: float
) -> None:
    arrivals = np.cumsum(gaps) * 1.37
    requests = [TraceRequest(f"r{i}", float(a), lengths[i], 1) for i, a in enumerate(arrivals)]
    cpu = CpuCosts(frontend=frontend, tokenize=9e-7, detokenize=4e-6, ipc=2.6e-5, schedule=0.0,
                   schedule_request=1.6e-6, stream=0.0, source="t", provenance="t",
                   tokenize_busy=((1, 5e-7), (2, 6e-7)))  # fmt: skip
    got = front_times(requests, cpu, workers)
    want, queues = _simpy_front(requests, cpu, workers)
    for name, values in want.items():
        assert list(getattr(got, name)) == values, name  # bit for bit
    for stage, samples in queues.items():
        t, n = got.queue_samples(stage)
        assert sorted(samples) == sorted(zip(t.tolist(), n.tolist(), strict=True)), stage
