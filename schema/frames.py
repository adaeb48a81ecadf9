"""Tolerant column access for the replay outputs (CSV round trips turn "" into NaN)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd


def numeric(frame: pd.DataFrame, column: str, default: float = float("nan")) -> np.ndarray:
    """A column as a read-only numeric array; ``default`` everywhere when it is missing.

    A column of plain numpy integers or floats is returned as it is (no copy: a
    step table has a million rows); anything else is converted to float, with
    NaN for values that are not numbers.
    """
    if column not in frame.columns:
        return np.full(len(frame), default)
    series = frame[column]
    if isinstance(series.dtype, np.dtype) and series.dtype.kind in "iuf":
        as_is: np.ndarray = series.to_numpy()
        return as_is
    values: np.ndarray = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
    return values


def blocked_mask(steps: pd.DataFrame, reason: str) -> np.ndarray:
    """Steps whose ``blocked`` is ``reason`` (a non-empty reason); False where it is missing.

    Accepts plain strings, a CSV read-back (NaN for ``""``) and categoricals.
    """
    if "blocked" not in steps.columns:
        return np.zeros(len(steps), dtype=bool)
    mask: np.ndarray = steps["blocked"].eq(reason).to_numpy(dtype=bool, na_value=False)
    return mask


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
