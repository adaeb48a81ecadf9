"""Plotly building blocks shared by the report's figures."""

from __future__ import annotations

import plotly.graph_objects as go


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
