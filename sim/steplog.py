"""Per-step records, kept as typed numpy columns so that a fast-forwarded run costs one slice."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

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
CHUNK_ROWS = 1 << 16
"""Rows of one column chunk; a full chunk is kept and a new one started (no regrowth copies)."""


class StepLog:
    """Rows of the step table in step order, one typed numpy column per field.

    Columns grow in fixed chunks; ``frame()`` joins each column once, so the
    table is held at its final size plus one column at most.

    ``kv_pages_used`` counts the pages held by requests once the step's plan is
    made: used pages minus the prefix cache's evictable (unreferenced) pages,
    which are reclaimable like free ones. ``cached_tokens`` and
    ``prompt_tokens`` are the scheduler's cumulative counters (their ratio is the
    prefix hit rate so far).
    """

    def __init__(self, kv_pages_total: int) -> None:
        self.kv_pages_total = kv_pages_total
        self._full: dict[str, list[np.ndarray]] = {name: [] for name in STEP_COLUMNS}
        self._chunk = self._new_chunk(CHUNK_ROWS)
        self._used = 0  # rows used in the current chunk
        self._blocked: dict[str, int] = {"": 0}
        self.num_steps = 0

    @staticmethod
    def _new_chunk(rows: int) -> dict[str, np.ndarray]:
        return {name: np.empty(rows, dtype=STEP_DTYPES[name]) for name in STEP_COLUMNS}

    def _code(self, blocked: str) -> int:
        code = self._blocked.get(blocked)
        if code is None:
            code = self._blocked[blocked] = len(self._blocked)
        return code

    def _reserve(self, rows: int) -> int:
        """Room for ``rows`` more rows in the current chunk; the index of the first."""
        i = self._used
        if i + rows > len(self._chunk["step"]):
            for name, column in self._chunk.items():
                self._full[name].append(column[:i])
            self._chunk = self._new_chunk(max(CHUNK_ROWS, rows))
            i = 0
        self._used = i + rows
        self.num_steps += rows
        return i

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
        row = (step, time, duration, batch_size, prefill_tokens, decode_requests, context_tokens,
               kv_pages_used, self.kv_pages_total, num_waiting, num_running, preempted,
               self._code(blocked), cached_tokens, prompt_tokens)  # fmt: skip
        i = self._reserve(1)
        for column, value in zip(self._chunk.values(), row, strict=True):
            column[i] = value

    def add_run(
        self,
        step: np.ndarray,
        time: np.ndarray,
        duration: np.ndarray,
        batch_size: int,
        context_tokens: np.ndarray,
        kv_pages_used: np.ndarray | int,
        num_waiting: int,
        num_running: int,
        blocked: str,
        cached_tokens: int,
        prompt_tokens: int,
    ) -> None:
        """A fast-forwarded run of pure-decode steps (no prefill, no preemption): one entry
        per step in the arrays, scalars repeat."""
        row = (step, time, duration, batch_size, 0, batch_size, context_tokens, kv_pages_used,
               self.kv_pages_total, num_waiting, num_running, 0, self._code(blocked),
               cached_tokens, prompt_tokens)  # fmt: skip
        i = self._reserve(len(step))
        j = i + len(step)
        for column, value in zip(self._chunk.values(), row, strict=True):
            column[i:j] = value

    @property
    def blocked_names(self) -> list[str]:
        """The ``blocked`` categories, by code."""
        return sorted(self._blocked, key=self._blocked.__getitem__)

    def frame(self) -> pd.DataFrame:
        """All rows, columns in ``STEP_COLUMNS`` order (``blocked`` as a categorical).

        Each column's chunks are joined in turn and the joined column replaces
        them, so the table is never held twice; the frame shares that memory.
        """
        data: dict[str, Any] = {}
        for name in STEP_COLUMNS:
            joined = np.concatenate([*self._full[name], self._chunk[name][: self._used]])
            self._full[name] = [joined]
            data[name] = joined
        self._chunk = self._new_chunk(CHUNK_ROWS)
        self._used = 0
        data["blocked"] = pd.Categorical.from_codes(data["blocked"], categories=self.blocked_names)
        return pd.DataFrame(data, columns=list(STEP_COLUMNS), copy=False)
