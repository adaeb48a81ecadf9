"""Time batch plans on the serving runner, as the engine's loop runs them.

Times per plan:

- *wall* (``duration_s``): the step end to end, as the strictly alternating
  loop runs it between ``schedule`` and ``complete``: the plan's
  ``StepInputs`` built on the host from the requests' token sequences
  (``StepDriver.inputs``), then ``TPLeader.launch`` (broadcast to the TP followers,
  the forward pass, sampling) and the tokens back on the host as a list.
- *launch* (``launch_s``): the host's time from the upload of the plan's inputs to the
  launch's return, as the step record's ``launched - enqueued``, in the strict runs (the
  median): how long the host is held before it can form the next step. On CPU the
  forward pass runs inside it;
- *device* (``device_s``, CUDA): the step's period when the same plan is
  launched back to back without waiting, as the overlapped loop launches
  steps: the time between the CUDA events that end consecutive steps. The host
  prepares each launch while the device runs the one before, so this is the
  device's time for the step, or the host's launch time where that is longer.
  On CPU the host is the device: the device time is the wall time.

The runner is built from the same ``RunnerArgs`` as ``engine serve``'s, so the
attention backend and CUDA graphs are the ones serving uses.
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

from core.scheduler import Plan, SchedulerConfig
from core.scheduler.shape import StepShape
from engine.runner.args import RunnerArgs
from engine.runner.tp import TPLeader, follower_main
from engine.sampling.params import SamplingParams
from engine.scheduler_proc.driver import StepDriver, Tracked
from lab.profile.grid import StepPoint
from sim.costs.profile import ProfileRow


@contextmanager
def serving_runner(args: RunnerArgs) -> Iterator[TPLeader]:
    """Rank 0's ``TPLeader``, with ranks 1..tp-1 following in child processes."""
    followers = [
        mp.get_context("spawn").Process(target=follower_main, args=(args, rank), daemon=True)
        for rank in range(1, args.tp_size)
    ]
    for proc in followers:
        proc.start()
    leader: TPLeader | None = None
    try:
        leader = TPLeader(args)
        yield leader
    finally:
        if leader is not None:
            leader.shutdown()
        for proc in followers:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()


class StepTimer:
    """Times ``StepPoint`` plans on one runner, whose pool has ``num_pages`` pages of
    ``page_size`` tokens; token ids are drawn below ``vocab`` at random (seeded)."""

    def __init__(
        self,
        leader: TPLeader,
        page_size: int,
        num_pages: int,
        vocab: int,
        seed: int = 0,
        scatter: bool = False,
    ) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.rng = np.random.default_rng(seed)
        # scattered: each plan's pages drawn in a random order of the pool, as serving leaves them
        self.pages = self.rng.permutation(num_pages).tolist() if scatter else None
        self.tp = leader.args.tp_size
        self.runner = leader.runner
        self.vocab = vocab
        config = SchedulerConfig(num_pages=num_pages, page_size=page_size)
        self.engine = StepDriver(config, leader.launch, eos_token_ids=())
        # per plan run, the median host time from the upload to the launch's return (the
        # step record's launched - enqueued), seconds; None where the runner does not say
        self.launches: list[float | None] = []

    def fits(self, point: StepPoint) -> bool:
        """Whether the pool holds the point and the request table each of its sequences."""
        pages = point.sequence_pages(self.page_size)
        longest = max(pages, default=0)
        return sum(pages) <= self.num_pages and longest <= self.runner.max_pages_per_seq

    def _track(self, rid: str, length: int) -> None:
        sequence = self.rng.integers(0, self.vocab, size=length).tolist()
        self.engine.tracked[rid] = Tracked(sequence, length, SamplingParams(), 0.0, 0.0)

    def run(self, point: StepPoint, repeats: int, warmup: int = 1) -> ProfileRow:
        """The point's median, fastest and slowest wall time over ``repeats`` (after
        ``warmup``), and its median device time."""
        plan = point.plan(self.page_size, self.pages)
        for chunk in plan.prefill:
            self._track(chunk.rid, chunk.start + chunk.length)
        for slot in plan.decode:
            self._track(slot.rid, slot.position + 1)
        engine = self.engine
        times, launches = [], []
        try:
            for i in range(warmup + repeats):
                start = time.perf_counter()
                handle = engine.run_model(plan, engine.inputs(plan))
                returned = time.time()
                handle.result()
                if i >= warmup:
                    times.append(time.perf_counter() - start)
                    if handle.enqueued is not None:
                        launches.append(returned - handle.enqueued)
            device = self._device_time(plan, repeats) if self.runner.device.type == "cuda" else None
        finally:
            engine.tracked.clear()
        launch = statistics.median(launches) if launches else None
        self.launches.append(launch)
        shape = StepShape.of_plan(plan)
        return ProfileRow(
            ProfileRow.step_kind(shape),
            shape,
            self.tp,
            statistics.median(times),
            min(times),
            max(times),
            repeats,
            point.split,
            statistics.median(times) if device is None else device,
            launch,
        )

    def _device_time(self, plan: Plan, repeats: int) -> float:
        """Median period of ``plan`` launched ``repeats + 1`` times back to back (CUDA)."""
        runner, engine = self.runner, self.engine
        runner.step_events = []
        try:
            handles = [engine.run_model(plan, engine.inputs(plan)) for _ in range(repeats + 1)]
            for handle in handles:
                handle.result()
            ends = [end for _, end in runner.step_events]
        finally:
            runner.step_events = None
        periods = [float(a.elapsed_time(b)) / 1e3 for a, b in itertools.pairwise(ends)]
        return statistics.median(periods)
