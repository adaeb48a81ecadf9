"""What a cost model is asked: the time of a GPU step, and of the CPU stages around it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from core.scheduler.shape import StepShape
    from sim.costs.reach import Reach


class GpuCostModel(ABC):
    """Time of one model step as a function of its shape, for a fixed model, hardware and TP.

    ``step_time`` is the step as the strict loop runs it (host work, device
    work, tokens back); ``device_time`` is its period when steps are launched
    back to back (the overlapped loop), the same where a model knows no
    difference. ``decode_times`` (``decode_device_times``) must equal
    ``step_time`` (``device_time``) applied to each step of a run of pure-decode
    steps (batch fixed, context growing by ``batch`` and the longest context by
    one each step); they exist so that fast-forwarded runs are priced with numpy
    in one call.
    """

    name: str
    profile: str | None
    provenance: str

    @abstractmethod
    def step_time(self, shape: StepShape) -> float: ...

    @abstractmethod
    def decode_times(self, batch: int, context_tokens: int, longest: int, k: int) -> np.ndarray:
        """Times of ``k`` decode steps of ``batch`` requests; step i reads
        ``context_tokens + i * batch`` KV positions, ``longest + i`` for its longest request."""

    def device_time(self, shape: StepShape) -> float:
        return self.step_time(shape)

    def times(self, shape: StepShape) -> tuple[float, float]:
        """``(step_time, device_time)`` of one step: what a loop that needs both asks, once
        per step (a model that consumes what it prices, ``sim.costs.recorded``, prices the
        step once)."""
        return self.step_time(shape), self.device_time(shape)

    def decode_device_times(
        self, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray:
        return self.decode_times(batch, context_tokens, longest, k)

    def launch_time(self, shape: StepShape) -> float | None:
        """How long the step's launch holds the host (None: not measured; the overlapped
        loop then holds it for the wall time less the device time)."""
        return None

    def decode_launch_times(
        self, batch: int, context_tokens: int, longest: int, k: int
    ) -> np.ndarray | None:
        """``launch_time`` of each step of a decode run (as ``decode_times``), or None."""
        return None

    def measured_reach(self) -> Reach | None:
        """How far the measured steps behind this model reach (None: it measured none)."""
        return None

    def describe(self) -> dict[str, object]:
        return {"name": self.name, "profile": self.profile, "provenance": self.provenance}


@dataclass(frozen=True, slots=True)
class CpuCosts:
    """Per-unit CPU costs of the stages around the GPU step, in seconds.

    ``frontend`` per request (HTTP parse), ``tokenize`` per input token,
    ``detokenize`` per output token, ``ipc`` per message hop, ``schedule`` per
    scheduler step plus ``schedule_request`` per request in the step's batch,
    ``stream`` per streamed chunk (the frontend's SSE event for one token).

    ``tokenize`` is a prompt's cost to a tokenizer that was idle when it came; one that goes
    straight on from the prompt before runs at the back-to-back rate of ``tokenize_busy``:
    ``(workers, s per input token)`` pairs, each measured with that many workers tokenizing
    at once, ascending (empty where the profile measured none: ``tokenize`` then stands for
    it). See ``tokenize_time``.
    """

    frontend: float
    tokenize: float
    detokenize: float
    ipc: float
    schedule: float
    schedule_request: float
    stream: float
    source: str
    provenance: str
    tokenize_busy: tuple[tuple[int, float], ...] = ()

    KINDS = (
        "frontend",
        "tokenize",
        "detokenize",
        "ipc",
        "schedule",
        "schedule_request",
        "stream",
    )

    BUSY_WORKERS = (1, 2, 4, 8)  # the worker counts a profile's ``tokenize_busy_N`` rows hold

    def schedule_time(self, batch_size: int) -> float:
        return self.schedule + self.schedule_request * batch_size

    def tokenize_time(self, tokens: int, busy: int = 0) -> float:
        """Seconds to tokenize a prompt of ``tokens``: by a tokenizer that was idle
        (``busy`` 0), or back to back with ``busy`` tokenizers (itself included) working at
        once: the rate measured with the most workers not above ``busy``."""
        rate = self.tokenize
        for workers, per_token in self.tokenize_busy:
            if busy < workers:
                break
            rate = per_token
        return rate * tokens

    def describe(self) -> dict[str, object]:
        out: dict[str, object] = {k: getattr(self, k) for k in self.KINDS}
        out["tokenize_busy"] = [list(p) for p in self.tokenize_busy]
        out["source"] = self.source
        out["provenance"] = self.provenance
        return out
