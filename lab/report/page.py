"""The HTML page around the figures: header, verdict, headline numbers, sections.

plotly.js is loaded once in ``<head>`` (inlined by default, so the file opens
offline; ``lab.report.plotlyjs`` for the other choices) and every figure is a
``<div>`` that uses it. The page fits a laptop's window (1,280 px and up): figures
follow the page's width, long values wrap or fold, and a table wider than the page
scrolls in a box of its own (``python -m lab.report.fits`` checks it in a browser).
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from lab.report.plotlyjs import INLINE, PlotlyJs
from schema.frames import as_float

PLOT_CONFIG = {"displaylogo": False, "responsive": True}
MODEBAR_PX = 30
"""Height of the band added above each figure for Plotly's toolbar, so that it covers no
title or legend."""
PLOTLY_TOP_MARGIN = 100
"""Plotly's top margin when a figure sets none."""
LONG_VALUE = 160
"""A table value longer than this is folded: its start shown, the rest behind a click."""

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       margin: 0; background: #f6f7f9; }
main { max-width: 1320px; margin: 0 auto; padding: 16px 28px 40px; overflow-wrap: break-word; }
h1 { font-size: 24px; margin: 10px 0 4px; }
h2 { font-size: 19px; margin: 30px 0 4px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.note { margin: 4px 0 10px; color: #555; font-size: 14px; }
.sub { color: #555; font-size: 14px; margin-bottom: 12px; }
.verdict { background: #fff4e5; border-left: 6px solid #f0883e; padding: 12px 16px;
           font-size: 16px; line-height: 1.45; margin: 10px 0 16px; }
.verdict b.limit { font-size: 18px; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr)); gap: 10px; }
.card { background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: 8px 12px; }
.card .k { color: #666; font-size: 12px; text-transform: uppercase; letter-spacing: .03em; }
.card .v { font-size: 20px; font-weight: 600; margin-top: 2px; }
.card .d { color: #666; font-size: 12px; }
.fig { background: #fff; border: 1px solid #e1e4e8; border-radius: 6px; padding: 6px;
       margin: 8px 0; }
table { border-collapse: collapse; background: #fff; font-size: 13px; max-width: 100%; }
td, th { border: 1px solid #e1e4e8; padding: 4px 10px; text-align: left; vertical-align: top;
         overflow-wrap: break-word; }
td.v { overflow-wrap: anywhere; }
.scroll { overflow-x: auto; max-width: 100%; }
.scroll table { max-width: none; font-size: 12px; }
.scroll td, .scroll th { padding: 3px 6px; }
details summary { cursor: pointer; color: #0969da; }
dl.legend { display: grid; grid-template-columns: max-content minmax(0, 1fr); gap: 2px 12px;
            font-size: 13px; color: #444; margin: 8px 0; }
dl.legend dt { font-weight: 600; }
dl.legend dd { margin: 0; }
th { background: #f0f2f5; }
tr.picked td { background: #fff4e5; font-weight: 600; }
nav { margin: 14px 0 0; font-size: 14px; }
nav a { color: #0969da; text-decoration: none; }
.two { display: grid; grid-template-columns: repeat(2, minmax(0, 1fr)); gap: 16px; }
.two > * { min-width: 0; }
@media (max-width: 900px) { .two { grid-template-columns: minmax(0, 1fr); } }
"""


@dataclass(frozen=True, slots=True)
class Card:
    key: str
    value: str
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Section:
    title: str
    note: str
    body: str


def fmt(value: Any, digits: int = 1, unit: str = "") -> str:
    """A number with thousands separators, or ``n/a``."""
    f = as_float(value)
    if f is None:
        return "n/a"
    text = f"{f:,.{digits}f}"
    return f"{text} {unit}".rstrip()


def figure_div(fig: go.Figure) -> str:
    """The figure as a ``<div>`` (plotly.js loaded by the page), ``MODEBAR_PX`` taller at
    the top so that the toolbar sits above its titles and legends (``fig`` is changed)."""
    layout = fig.layout
    top = layout.margin.t if layout.margin.t is not None else PLOTLY_TOP_MARGIN
    fig.update_layout(margin_t=top + MODEBAR_PX, height=(layout.height or 450) + MODEBAR_PX)
    body = pio.to_html(fig, full_html=False, include_plotlyjs=False, config=PLOT_CONFIG)
    return f'<div class="fig">{body}</div>'


def value_html(value: Any) -> str:
    """A table value, escaped; past ``LONG_VALUE`` characters folded behind a click."""
    text = "-" if value is None else str(value)
    if len(text) <= LONG_VALUE:
        return html.escape(text)
    cut = text.rfind(" ", 0, LONG_VALUE)
    cut = cut if cut > LONG_VALUE // 2 else LONG_VALUE
    return (
        f"<details><summary>{html.escape(text[:cut])} … ({len(text):,} characters)</summary>"
        f"{html.escape(text)}</details>"
    )


def key_value_table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td class='v'>{value_html(v)}</td></tr>"
        for k, v in rows
    )
    return f"<table>{cells}</table>"


def cards_html(cards: list[Card]) -> str:
    items = "".join(
        f'<div class="card"><div class="k">{html.escape(c.key)}</div>'
        f'<div class="v">{html.escape(c.value)}</div>'
        f'<div class="d">{html.escape(c.detail)}</div></div>'
        for c in cards
    )
    return f'<div class="cards">{items}</div>'


def trace_path(summary: dict[str, Any]) -> str:
    """The trace's path: ``summary.trace`` is a path or a dict with a ``path``."""
    trace = summary.get("trace")
    if isinstance(trace, dict):
        trace = trace.get("path")
    return str(trace) if trace else "unknown trace"


def run_description(summary: dict[str, Any]) -> str:
    """One line naming the trace, the model and the scheduler's limits."""
    cfg = summary.get("config") or {}
    parts = [f"trace {trace_path(summary)}"]
    trace = summary.get("trace")
    if isinstance(trace, dict):
        for key in ("format", "rate_scale", "limit"):
            if trace.get(key) is not None:
                parts.append(f"{key} {trace[key]}")
    for key in ("model", "hardware", "policy"):
        if cfg.get(key) is not None:
            parts.append(f"{key} {cfg[key]}")
    if cfg.get("tp") is not None:
        parts.append(f"TP {cfg['tp']}")
    if cfg.get("num_tokenizers") is not None:
        parts.append(f"{cfg['num_tokenizers']} tokenizer worker(s)")
    for key in ("max_running", "max_prefill_tokens"):
        if cfg.get(key) is not None:
            parts.append(f"{key} {cfg[key]}")
    if cfg.get("num_pages") is not None:
        parts.append(f"{cfg['num_pages']} KV pages x {cfg.get('page_size', '?')} tokens")
    return " · ".join(str(p) for p in parts)


def section_id(title: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in title.lower())


def page_html(title: str, header: str, sections: list[Section], script: str | None = None) -> str:
    """The page; ``script`` loads plotly.js (default: inlined, ``PlotlyJs.script``)."""
    body = "".join(
        f"<section id='{section_id(s.title)}'><h2>{html.escape(s.title)}</h2>"
        f"<p class='note'>{html.escape(s.note)}</p>{s.body}</section>"
        for s in sections
    )
    nav = " · ".join(
        f"<a href='#{section_id(s.title)}'>{html.escape(s.title)}</a>" for s in sections
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style>"
        f"{INLINE.script(Path()) if script is None else script}</head>"
        f"<body><main>{header}<nav>{nav}</nav>{body}</main></body></html>"
    )


def write_page(
    path: Path, title: str, header: str, sections: list[Section], plotlyjs: PlotlyJs = INLINE
) -> None:
    """Write the page at ``path``, loading plotly.js as ``plotlyjs`` says."""
    path.parent.mkdir(parents=True, exist_ok=True)
    page = page_html(title, header, sections, plotlyjs.script(path))
    path.write_text(page, encoding="utf-8")
