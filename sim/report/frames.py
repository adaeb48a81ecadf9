"""Tolerant column access for the replay outputs (CSV round trips turn "" into NaN)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def numeric(frame: pd.DataFrame, column: str, default: float = float("nan")) -> np.ndarray:
    """A column as a float array; ``default`` everywhere when the column is missing."""
    if column not in frame.columns:
        return np.full(len(frame), default)
    values: np.ndarray = pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=float)
    return values


def blocked_reasons(steps: pd.DataFrame) -> np.ndarray:
    """The ``blocked`` column as an object array, with NaN and missing read as ``""``.

    Accepts plain strings, a CSV read-back (NaN for ``""``) and categoricals.
    """
    if "blocked" not in steps.columns:
        return np.full(len(steps), "", dtype=object)
    reasons: np.ndarray = steps["blocked"].to_numpy(dtype=object)
    missing = pd.isna(reasons)
    if missing.any():
        reasons = reasons.copy()
        reasons[missing] = ""
    return reasons


def get_path(mapping: dict[str, Any], *keys: str) -> Any:
    """``mapping[k1][k2]...`` or None when any level is missing or not a dict."""
    node: Any = mapping
    for key in keys:
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def as_float(value: Any) -> float | None:
    """A finite float, or None for missing, NaN and non-numeric values."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None
