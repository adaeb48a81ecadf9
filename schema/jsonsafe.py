"""JSON-ready values: what ``summary.json`` and the report's verdict are made of."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars as Python scalars and NaN/inf as None, recursively."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
