"""Per-step records, kept as numpy blocks so fast-forwarded runs cost one append."""

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
_FLOAT = ("time", "duration_s")


class StepLog:
    """Rows of ``steps.csv`` in step order: single steps as tuples, runs as array blocks.

    ``kv_pages_used`` counts the pages held by requests once the step's plan is
    made: used pages minus the prefix cache's evictable (unreferenced) pages,
    which are reclaimable like free ones. ``cached_tokens`` and
    ``prompt_tokens`` are the scheduler's cumulative counters (their ratio is the
    prefix hit rate so far).
    """

    def __init__(self, kv_pages_total: int) -> None:
        self.kv_pages_total = kv_pages_total
        self._lengths: list[int] = []
        self._values: list[tuple[Any, ...]] = []  # per block: a scalar or an array per column
        self._blocked: dict[str, int] = {"": 0}
        self.num_steps = 0

    def _code(self, blocked: str) -> int:
        code = self._blocked.get(blocked)
        if code is None:
            code = self._blocked[blocked] = len(self._blocked)
        return code

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
        self._lengths.append(1)
        self._values.append(
            (step, time, duration, batch_size, prefill_tokens, decode_requests, context_tokens,
             kv_pages_used, self.kv_pages_total, num_waiting, num_running, preempted,
             self._code(blocked), cached_tokens, prompt_tokens)
        )  # fmt: skip
        self.num_steps += 1

    def add_run(self, block: dict[str, np.ndarray | int | float | str]) -> None:
        """A fast-forwarded run; array values give one entry per step, scalars repeat."""
        k = len(block["step"])  # type: ignore[arg-type]
        row = []
        for name in STEP_COLUMNS:
            value = block.get(name, self.kv_pages_total if name == "kv_pages_total" else None)
            if value is None:
                raise KeyError(f"run block lacks {name}")
            if name == "blocked":
                value = self._code(str(value))
            elif isinstance(value, np.ndarray) and len(value) != k:
                raise ValueError(f"run block column {name} has {len(value)} entries, not {k}")
            row.append(value)
        self._lengths.append(k)
        self._values.append(tuple(row))
        self.num_steps += k

    def frame(self) -> pd.DataFrame:
        """All rows; each column is one ``np.repeat`` plus a slice per array-valued block."""
        lengths = np.asarray(self._lengths, dtype=np.int64)
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        data: dict[str, Any] = {}
        for c, name in enumerate(STEP_COLUMNS):
            dtype = np.float64 if name in _FLOAT else np.int64
            firsts = [v[c] if not isinstance(v[c], np.ndarray) else 0 for v in self._values]
            col = np.repeat(np.asarray(firsts, dtype=dtype), lengths)
            for b, v in enumerate(self._values):
                if isinstance(v[c], np.ndarray):
                    col[offsets[b] : offsets[b + 1]] = v[c]
            data[name] = col
        names = sorted(self._blocked, key=self._blocked.__getitem__)
        data["blocked"] = pd.Categorical.from_codes(data["blocked"], categories=names)
        return pd.DataFrame(data, columns=list(STEP_COLUMNS))
