"""What the simulated scheduler loop is told: how it runs (``LoopSettings``, the engine's flags)
and what it needs of the pipeline around it (``LoopHost``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import simpy

from core.scheduler import DecodeRun, Plan, SchedulerStats
from core.scheduler.shape import StepShape
from sim.costs.acceptance import AcceptanceModel
from sim.costs.copies import CopyCosts
from sim.model.drafter import SharedDrafter
from sim.model.frontend import Leave, Streamed


class LoopHost(Protocol):
    """What the loop needs of the pipeline around it: arrivals in, step records and tokens out."""

    transfers_kv: bool  # a PD role's server: its step record counts the KV transfers

    def admit_inbox(self) -> float: ...
    def nothing_to_come(self) -> bool: ...
    def wait_for_arrival(self) -> simpy.Event: ...
    def next_arrival(self) -> float | None: ...
    def sample_scheduler_queue(self, now: float) -> None: ...
    def note_scheduled(self, plan: Plan) -> None: ...
    def record_step(
        self, plan: Plan, shape: StepShape, start: float, duration: float, stats: SchedulerStats
    ) -> None: ...
    def record_run(
        self, run: DecodeRun, starts: np.ndarray, durations: np.ndarray, stats: SchedulerStats
    ) -> None: ...
    def handle_events(self, plan: Plan, events: list[Any], end: float) -> None: ...
    def tokens_of_run(self, rids: tuple[str, ...], leave: np.ndarray) -> None: ...
    def stream_tokens(self, leave: Leave, chunks: int) -> Streamed | None: ...


@dataclass(frozen=True, slots=True)
class LoopSettings:
    """How the simulated scheduler process runs (the engine's ``--overlap``, and the fast path)."""

    overlap: bool = False
    fast_forward: bool = True
    max_run_steps: int = 4096
    copies: CopyCosts | None = None  # prices of the host tier's copies; None: no tier
    record_steps: bool = False  # keep the step record (``sim.model.step_record``)
    layout: str = "split"  # the engine's process layout (``schema.layouts.LAYOUTS``)
    acceptance: AcceptanceModel | None = None  # speculative decoding: drafts accepted
    seed: int = 0  # of the acceptance draws
    drafter: SharedDrafter | None = None  # its drafts' cost is the loop's (a model that drafts)

    def copy_time(self, plan: Plan, page_size: int) -> float:
        """The time of ``plan``'s copies: its writes, then its loads."""
        if self.copies is None or not plan.has_copies:
            return 0.0
        writes = self.copies.write_time(len(plan.writes) * page_size)
        return writes + self.copies.load_time(len(plan.loads) * page_size)
