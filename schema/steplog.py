"""Per-step records, kept as blocks (a step, or a fast-forwarded run) and written in chunks."""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np
import pandas as pd

from schema.exactsum import ExactSum
from schema.tables import TableWriter

STEP_COLUMNS = (
    "step",
    "time",
    "duration_s",
    "batch_size",
    "prefill_tokens",
    "decode_requests",
    "context_tokens",
    "kv_pages_used",
    "kv_pages_total",
    "num_waiting",
    "num_running",
    "preempted",
    "blocked",
    "cached_tokens",
    "prompt_tokens",
)
STEP_DTYPES: dict[str, type[np.generic]] = {
    "step": np.int32,
    "time": np.float64,
    "duration_s": np.float64,
    "batch_size": np.int32,
    "prefill_tokens": np.int32,
    "decode_requests": np.int32,
    "context_tokens": np.int32,
    "kv_pages_used": np.int32,
    "kv_pages_total": np.int32,
    "num_waiting": np.int32,
    "num_running": np.int32,
    "preempted": np.int32,
    "blocked": np.int8,  # a code into the categories of ``StepLog.blocked_names``
    "cached_tokens": np.int64,
    "prompt_tokens": np.int64,
}
"""Column types: per-step counts are 32-bit (a batch's context stays far below 2^31 tokens);
the cumulative token counters are 64-bit."""
BLOCK_FIELDS = (
    "first_step", "batch_size", "prefill_tokens", "decode_requests", "context_tokens",
    "context_growth", "kv_pages_held", "num_waiting", "num_running", "preempted", "blocked",
    "cached_tokens", "prompt_tokens",
)  # fmt: skip
"""What a block records once for all its steps (see ``StepLog``)."""


class StepLog:
    """Rows of the step table in step order, recorded as blocks of steps.

    A block is one step or a run of ``k`` identical pure-decode steps. Each step
    keeps its own start time, duration and newly allocated pages; a block keeps
    the rest once: step ``i`` of a block has step number ``first_step + i``,
    context ``context_tokens + context_growth * (i + 1)`` (a run's batch grows
    every context by one token a step; a single step has growth 0) and
    ``kv_pages_used`` = ``kv_pages_held`` plus the pages allocated by steps
    ``0..i`` of the block. Once ``flush_steps`` steps are recorded, their blocks
    are expanded into typed columns and written to ``sink`` (``flush``), and the
    log lets them go: it holds at most one chunk of steps, whatever the run's
    length. The chunks make the same table as one flush at the end (``close``).

    ``kv_pages_used`` counts the pages held by requests once the step's plan is
    made: used pages minus the prefix cache's evictable (unreferenced) pages,
    which are reclaimable like free ones. ``cached_tokens`` and
    ``prompt_tokens`` are the scheduler's cumulative counters (their ratio is the
    prefix hit rate so far).
    """

    def __init__(self, kv_pages_total: int, sink: TableWriter, flush_steps: int) -> None:
        if flush_steps < 1:
            raise ValueError(f"flush_steps must be >= 1, got {flush_steps}")
        self.kv_pages_total = kv_pages_total
        self.sink = sink
        self.flush_steps = flush_steps
        self._blocked: dict[str, int] = {"": 0}
        self.num_steps = 0
        self.busy_s = ExactSum()  # of the steps' durations
        self._flushed = False
        self._clear()

    def _clear(self) -> None:
        """Let the written steps go (new buffers: a written chunk may share the old ones)."""
        self._time = array("d")
        self._duration = array("d")
        self._new_pages = array("i")
        self._lengths = array("q")
        self._blocks = array("q")  # BLOCK_FIELDS of each block, block after block

    def _code(self, blocked: str) -> int:
        code = self._blocked.get(blocked)
        if code is None:
            code = self._blocked[blocked] = len(self._blocked)
        return code

    def _block(self, k: int, values: tuple[int, ...]) -> None:
        self._lengths.append(k)
        self._blocks.extend(values)
        self.num_steps += k
        if len(self._time) >= self.flush_steps:
            self.flush()

    def add(
        self,
        step: int,
        time: float,
        duration: float,
        batch_size: int,
        prefill_tokens: int,
        decode_requests: int,
        context_tokens: int,
        kv_pages_used: int,
        num_waiting: int,
        num_running: int,
        preempted: int,
        blocked: str,
        cached_tokens: int,
        prompt_tokens: int,
    ) -> None:
        self._time.append(time)
        self._duration.append(duration)
        self._new_pages.append(0)
        self._block(1, (step, batch_size, prefill_tokens, decode_requests, context_tokens, 0,
                        kv_pages_used, num_waiting, num_running, preempted, self._code(blocked),
                        cached_tokens, prompt_tokens))  # fmt: skip

    def add_run(
        self,
        first_step: int,
        time: np.ndarray,
        duration: np.ndarray,
        batch_size: int,
        context_tokens: int,
        kv_pages_held: int,
        new_pages: tuple[int, ...],
        num_waiting: int,
        num_running: int,
        blocked: str,
        cached_tokens: int,
        prompt_tokens: int,
    ) -> None:
        """A fast-forwarded run of pure-decode steps (no prefill, no preemption):
        ``context_tokens`` before its first step, ``new_pages`` allocated by each step."""
        self._time.frombytes(time.astype(np.float64, copy=False).tobytes())
        self._duration.frombytes(duration.astype(np.float64, copy=False).tobytes())
        self._new_pages.extend(new_pages)
        self._block(len(time), (first_step, batch_size, 0, batch_size, context_tokens,
                                batch_size, kv_pages_held, num_waiting, num_running, 0,
                                self._code(blocked), cached_tokens, prompt_tokens))  # fmt: skip

    @property
    def blocked_names(self) -> list[str]:
        """The ``blocked`` categories, by code."""
        return sorted(self._blocked, key=self._blocked.__getitem__)

    def _per_block(self, name: str) -> np.ndarray:
        table = np.frombuffer(self._blocks, dtype=np.int64).reshape(-1, len(BLOCK_FIELDS))
        return table[:, BLOCK_FIELDS.index(name)]

    def _column(self, name: str, lengths: np.ndarray, within: np.ndarray) -> np.ndarray:
        """One column, expanded from the blocks (``within``: each step's index in its block)."""
        dtype = STEP_DTYPES[name]
        if name in ("time", "duration_s"):  # shared, not copied: the log lets them go
            return np.frombuffer(self._time if name == "time" else self._duration)
        if name == "kv_pages_total":
            return np.full(len(within), self.kv_pages_total, dtype=dtype)
        if name == "step":
            out = np.repeat(self._per_block("first_step").astype(dtype), lengths)
            out += within
            return out
        if name == "context_tokens":
            out = np.repeat(self._per_block("context_growth").astype(dtype), lengths)
            out *= within + 1
            out += np.repeat(self._per_block(name).astype(dtype), lengths)
            return out
        if name == "kv_pages_used":
            new = np.frombuffer(self._new_pages, dtype=np.int32)
            allocated = np.cumsum(new, dtype=np.int64)  # then: minus what earlier blocks took
            starts = np.cumsum(lengths) - lengths
            before = allocated[starts] - new[starts] - self._per_block("kv_pages_held")
            allocated -= np.repeat(before, lengths)
            return allocated.astype(dtype)
        return np.repeat(self._per_block(name).astype(dtype), lengths)

    def flush(self) -> None:
        """Write the steps recorded since the last flush to the sink, in ``STEP_COLUMNS``
        order (``blocked`` as a categorical of the categories so far), and let them go.
        An empty chunk is written only as the first (a table of no steps)."""
        if not self._time and self._flushed:
            return
        self._flushed = True
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        within = np.arange(len(self._time), dtype=np.int32)
        within -= np.repeat((np.cumsum(lengths) - lengths).astype(np.int32), lengths)
        data: dict[str, Any] = {name: self._column(name, lengths, within) for name in STEP_COLUMNS}
        del within
        data["blocked"] = pd.Categorical.from_codes(data["blocked"], categories=self.blocked_names)
        self.busy_s.add(data["duration_s"])
        self.sink.write(pd.DataFrame(data, columns=list(STEP_COLUMNS), copy=False))
        self._clear()

    def close(self) -> None:
        """Write what is left and end the table."""
        self.flush()
        self.sink.close()
