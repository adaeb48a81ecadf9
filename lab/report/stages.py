"""The stages a request passes through, and how much of its latency each one takes.

Each stage is a ``*_ms`` column of ``requests.csv``. The stages up to
``prefill`` end at the first token, so they make up TTFT; ``decode`` and
``detokenize`` follow (the report's decode stage leaves out the detokenizer's
share of ``decode_ms``). A missing column (e.g. ``frontend_ms``) counts as zero.

    arrival ─► frontend ─► tokenizer queue ─► tokenize ─► ipc ─► scheduler wait ─► prefill
            └──────────────────────────────── TTFT ────────────────────────────────────┘
            ─► decode ─► detokenize
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from schema.frames import numeric


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    column: str
    label: str
    color: str
    in_ttft: bool


STAGES: tuple[Stage, ...] = (
    Stage("frontend", "frontend_ms", "frontend", "#8c564b", True),
    Stage("tokenizer_queue", "tokenizer_queue_ms", "tokenizer queue", "#9467bd", True),
    Stage("tokenize", "tokenize_ms", "tokenize", "#c5b0d5", True),
    Stage("ipc", "ipc_ms", "IPC", "#c7c7c7", True),
    Stage("scheduler_wait", "scheduler_wait_ms", "scheduler wait", "#d62728", True),
    Stage("prefill", "prefill_ms", "prefill", "#ff7f0e", True),
    Stage("decode", "decode_ms", "decode", "#1f77b4", False),
    Stage("detokenize", "detokenize_ms", "detokenize", "#2ca02c", False),
)

STAGE_BY_NAME: dict[str, Stage] = {s.name: s for s in STAGES}


def completed_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """Rows of completed requests (all rows when there is no ``status`` column)."""
    if "status" not in requests.columns:
        return requests
    return requests[requests["status"].astype(str) == "completed"]


def stage_column(requests: pd.DataFrame, stage: Stage) -> np.ndarray:
    """The stage's times in ms as floats; zeros when the column is missing."""
    return numeric(requests, stage.column, default=0.0)


def _mean(values: np.ndarray) -> float:
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if finite.size else float("nan")


def stage_means_ms(requests: pd.DataFrame) -> dict[str, float]:
    """Mean time in ms of each stage over the given requests.

    ``decode_ms`` (first to last token at the client) contains the detokenizer's
    time for every chunk after the first, which ``detokenize_ms`` counts too; the
    decode stage here is what is left of it, so that the stages add up to E2E.
    """
    means = {s.name: _mean(stage_column(requests, s)) for s in STAGES}
    decode = stage_column(requests, STAGE_BY_NAME["decode"])
    detok = stage_column(requests, STAGE_BY_NAME["detokenize"])
    means["decode"] = _mean(np.maximum(decode - np.nan_to_num(detok), 0.0))
    return means


def stage_shares(requests: pd.DataFrame, total_column: str, ttft_only: bool) -> dict[str, float]:
    """Mean time of each stage divided by the mean of ``total_column`` (e.g. ``e2e_ms``).

    A ratio of means, so that long requests weigh in proportion to their time.
    With ``ttft_only`` only the stages before the first token are listed. When
    ``total_column`` is missing, the sum of the listed stage means stands in.
    """
    means = stage_means_ms(requests)
    names = [s.name for s in STAGES if s.in_ttft or not ttft_only]
    total = float("nan")
    if total_column in requests.columns:
        total = _mean(numeric(requests, total_column))
    if not np.isfinite(total) or total <= 0:
        total = float(np.nansum([means[n] for n in names]))
    if not np.isfinite(total) or total <= 0:
        return {n: 0.0 for n in names}
    return {n: (means[n] / total if np.isfinite(means[n]) else 0.0) for n in names}
