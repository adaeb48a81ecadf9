"""Plotly building blocks shared by the report's figures."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np
import plotly.graph_objects as go

NARROW_LOG_SPAN = 3.0
"""Largest / smallest value under which a log axis keeps Plotly's ticks (fine there)."""


def annotate_no_data(fig: go.Figure, row: int, col: int, text: str = "no data") -> None:
    """Write ``text`` in the middle of an empty subplot.

    Paper coordinates, because Plotly does not draw the axes of a subplot
    without traces, and an annotation placed on them would land elsewhere.
    """
    subplot = fig.get_subplot(row, col)
    x0, x1 = subplot.xaxis.domain
    y0, y1 = subplot.yaxis.domain
    fig.add_annotation(
        text=text,
        showarrow=False,
        xref="paper",
        yref="paper",
        x=(x0 + x1) / 2,
        y=(y0 + y1) / 2,
        font={"size": 14, "color": "#888"},
    )


def tick_text(value: float, percent: bool = False) -> str:
    """A tick label in full: 0.002, 5, 1,000, 20k, 1M; with ``percent`` a share as 0.1%."""
    if percent:
        return tick_text(100 * value) + "%"
    if value >= 1e6:
        return f"{value / 1e6:g}M"
    if value >= 1e4:
        return f"{value / 1e3:g}k"
    if value >= 1:
        return f"{value:,.0f}" if value == round(value) else f"{value:g}"
    return f"{value:.{-math.floor(math.log10(value) + 1e-9)}f}"


def log_axis(*values: Iterable[float] | np.ndarray, percent: bool = False) -> dict[str, Any]:
    """A log axis with explicit ticks over ``values``' positive range: every decade labelled
    in full (1, 10, 100, ...; Plotly's own labels skip some and print 2 3 ... 9 between),
    with 2 and 5 between decades over up to three decades, and 2, 3, 5, 7 within one.
    Plotly's own ticks stay over a span narrower than ``NARROW_LOG_SPAN``.
    For ``fig.update_xaxes(**log_axis(x))``."""
    finite = [np.asarray(list(v) if not isinstance(v, np.ndarray) else v, dtype=float)
              for v in values]  # fmt: skip
    flat = np.concatenate(finite) if finite else np.array([])
    flat = flat[np.isfinite(flat) & (flat > 0)]
    if not flat.size or flat.max() < NARROW_LOG_SPAN * flat.min():
        return {"type": "log"}
    first = math.floor(math.log10(flat.min()) + 1e-9)
    last = math.ceil(math.log10(flat.max()) - 1e-9)
    decades = max(last - first, 1)
    multiples = (1, 2, 3, 5, 7) if decades <= 1 else (1, 2, 5) if decades <= 3 else (1,)
    step = 1 if decades <= 6 else 2
    ticks = [m * 10.0**d for d in range(first, last + 1, step) for m in multiples]
    ticks = [t for t in ticks if t <= 10.0**last * 1.0001]
    return {
        "type": "log",
        "tickmode": "array",
        "tickvals": ticks,
        "ticktext": [tick_text(t, percent) for t in ticks],
    }
