"""The simulated cluster: N replicas of the pipeline behind one ``core.router.Router``.

Modelled on ``engine router`` in front of N servers (or, with ``shared_frontend``, on
``engine serve --dp N``: one frontend and tokenizer pool in front of N replicas), in one
SimPy environment::

    arrival ─► router ─► replica k: frontend ─► IPC ─► tokenizer pool ─► IPC ─► scheduler ─► ...
               (the core:          (each replica its own stages, scheduler core,
                route(req, now))    GPU steps, detokenizer and streaming)

- A request reaches the router at its trace arrival time (the clock lands as
  ``sim.model.frontend.front_times`` lands it) and is placed with the load the
  router's books hold then: the requests routed and not yet ended. Its key for
  ``cache_aware`` is the trace's ``hash_ids`` (512-token blocks, a match counted in
  tokens: ``RouteRequest.block_tokens``), its tokens the trace's input and output
  lengths; traces carry no session.
- The replica's frontend and tokenizer pool time the request as it is placed
  (``FrontQueue``: the recurrences of ``front_times``, so one replica gives the
  closed form's times); it reaches that replica's scheduler at ``sched_arrival``.
  With ``shared_frontend`` every replica's requests go through the one
  ``FrontQueue`` (its queues are reported on replica 0).
- The router hears of a request's end when the replica's scheduler finishes it
  (``Router.finished``) or rejects it (``Router.aborted``); tokens still on
  their way to the client are not counted as load.
- A replica cannot know ahead when the router will send it a request, so its
  scheduler loop is ``interruptible``: a request reaching the scheduler cuts a
  decode run after the step running then (the same cut as a known arrival).
- Replicas that share one GPU (``colocation`` given: ``sim.model.shared_gpu``)
  stretch each other's steps by the co-location table.
- With ``frontend_loop`` a frontend's event loop also streams its replicas' tokens
  (``FrontQueue.stream``): each replica gives it the steps it prices, a decode run
  cut short its steps that do not run. One server with the loop runs as a cluster of
  one (its intake is timed during the run).
"""

from __future__ import annotations

from array import array
from collections.abc import Generator
from functools import partial
from typing import Any

import numpy as np
import simpy

from core.router import Router, RouteRequest
from schema.traces.record import HASH_BLOCK_TOKENS
from sim.costs.base import CpuCosts, GpuCostModel
from sim.costs.colocation import Colocation
from sim.model.frontend import FrontQueue, Leave, Streamed, queue_samples
from sim.model.loop_settings import LoopSettings
from sim.model.pipeline import delay_to
from sim.model.replica import Progress, Replica, RequestRecords
from sim.model.shared_gpu import SharedGpu


class ClusterReplica(Replica):
    """One server of the cluster: fed by the router, ends reported back to it."""

    def __init__(
        self,
        cluster: Cluster,
        name: str,
        scheduler: Any,
        gpu: GpuCostModel,
        cpu: CpuCosts,
        *,
        router: Router,
        front: FrontQueue,
        reports_front: bool,
        loop: LoopSettings,
        progress: Progress | None,
    ) -> None:
        super().__init__(cluster.env, cluster.records, scheduler, gpu, cpu, loop, progress)
        self.cluster = cluster
        self.router = router  # the router core that placed its requests and hears of their ends
        self.name = name
        self.front = front
        self.reports_front = reports_front  # the front's queues are this replica's to report
        self.on_way = 0  # placed here, not yet at the scheduler
        self.loop.interruptible = True
        self.process: simpy.Process | None = None

    def enter(self, i: int, now: float) -> None:
        """Request ``i`` placed here at ``now``: time its stages before the scheduler and
        have it reach the scheduler then."""
        t = self.times
        parsed, entered, start, tokenized, sched = self.front.enter(now, self.trace[i].input_length)
        t["arrival"][i] = now
        t["parsed"][i] = parsed
        t["tokenizer_enter"][i] = entered
        t["tokenize_start"][i] = start
        t["tokenized"][i] = tokenized
        self.on_way += 1
        reach = self.env.timeout(delay_to(now, sched))
        reach.callbacks.append(lambda _: self._reach(i))

    def stream_tokens(self, leave: Leave, chunks: int) -> Streamed | None:
        return self.front.stream(leave, chunks)

    def _reach(self, i: int) -> None:
        now = self.env.now
        self.times["sched_arrival"][i] = now
        self.on_way -= 1
        self._inbox.append(i)
        self.sample_scheduler_queue(now)
        self.wake()

    def wake(self) -> None:
        """Something changed for the loop: wake it if idle, cut its decode run if in one."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        elif self.process is not None:
            self.loop.cut_run(self.process)

    def next_arrival(self) -> float | None:
        return None  # the router decides during the run: arrivals cut runs (``wake``)

    def nothing_to_come(self) -> bool:
        return self.cluster.routing_done and self.on_way == 0 and not self._inbox

    def ended(self, i: int, rejected: bool) -> None:
        super().ended(i, rejected)
        rid, now = self.trace[i].rid, self.env.now
        if rejected:
            self.router.aborted(rid, now)
        else:
            self.router.finished(rid, now)

    def front_queue_samples(self, stage: str) -> tuple[np.ndarray, np.ndarray]:
        if not self.reports_front:
            return np.zeros(0), np.zeros(0, np.int64)
        return queue_samples(self.front.waits(stage))


class Cluster:
    """One replay on ``len(schedulers)`` replicas behind ``router``, each priced by ``costs``
    (GPU, CPU), on one GPU shared by all with ``colocation``, else each on its own: ``run()``
    it, then read the shared per-request records, ``replica_of`` and each replica's step and
    queue records."""

    def __init__(
        self,
        records: RequestRecords,
        schedulers: list[Any],
        router: Router,
        costs: tuple[GpuCostModel, CpuCosts],
        *,
        num_tokenizers: int = 1,
        loop: LoopSettings = LoopSettings(),
        progress: Progress | None = None,
        colocation: Colocation | None = None,
        shared_frontend: bool = False,
        frontend_loop: bool = False,
    ) -> None:
        self.env = simpy.Environment()
        self.records = records
        self.router = router
        self.routing_done = False
        self.replica_of = array("q", [-1]) * len(records.trace)
        gpu, cpu = costs
        layout = loop.layout

        def front() -> FrontQueue:
            return FrontQueue(cpu, num_tokenizers, frontend_loop, layout)

        shared = front() if shared_frontend else None
        self.replicas = [
            self._replica(
                k,
                s,
                (gpu, cpu),
                front=shared or front(),
                reports_front=shared is None or k == 0,
                loop=loop,
                progress=progress,
            )
            for k, s in enumerate(schedulers)
        ]
        self._by_name = {r.name: k for k, r in enumerate(self.replicas)}
        self.shared = None if colocation is None else SharedGpu(colocation, len(self.replicas))
        if self.shared is not None:
            for k, r in enumerate(self.replicas):
                r.loop.seat = self.shared.seat(k)
        for r in self.replicas:
            r.router.add_worker(r.name)

    def _replica(
        self, k: int, scheduler: Any, costs: tuple[GpuCostModel, CpuCosts], **settings: Any
    ) -> ClusterReplica:
        """Replica ``k``, driving ``scheduler``, priced by ``costs``."""
        return ClusterReplica(self, str(k), scheduler, *costs, router=self.router, **settings)

    def run(self) -> None:
        env = self.env
        env.process(self._route())
        for k, r in enumerate(self.replicas):
            r.process = env.process(r.loop.run())
            if self.shared is not None:
                self.shared.cuts[k] = partial(r.loop.cut_run, r.process)
        env.run()
        stuck = [r.name for r in self.replicas if r.process is None or r.process.is_alive]
        if stuck:
            raise RuntimeError(f"replicas {stuck} did not finish their work")
        for r in self.replicas:
            r.finish()

    def _route(self) -> Generator[simpy.Event, Any, None]:
        """Each request, at its arrival, to the replica the router picks then."""
        env = self.env
        for i, r in enumerate(self.records.trace):
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            now = env.now
            request = RouteRequest(
                r.rid, tuple(r.hash_ids), r.input_length, r.output_length,
                block_tokens=HASH_BLOCK_TOKENS,
            )  # fmt: skip
            self._place(i, request, now)
        self.routing_done = True
        for replica in self.replicas:
            replica.wake()

    def _place(self, i: int, request: RouteRequest, now: float) -> None:
        """Request ``i`` to the replica the router picks now."""
        k = self._by_name[self.router.route(request, now)]
        self.replica_of[i] = k
        self.replicas[k].enter(i, now)
