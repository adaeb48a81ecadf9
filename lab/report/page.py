"""The HTML page around the figures: header, verdict, headline numbers, sections.

The page is self-contained: plotly.js is inlined once in ``<head>`` and every
figure is a ``<div>`` that uses it, so the file opens offline.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
from plotly.offline import get_plotlyjs

from schema.frames import as_float

PLOT_CONFIG = {"displaylogo": False, "responsive": True}

CSS = """
body { font-family: -apple-system, "Segoe UI", Helvetica, Arial, sans-serif; color: #222;
       margin: 0; background: #f6f7f9; }
main { max-width: 1320px; margin: 0 auto; padding: 16px 28px 40px; }
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
table { border-collapse: collapse; background: #fff; font-size: 13px; }
td, th { border: 1px solid #e1e4e8; padding: 4px 10px; text-align: left; vertical-align: top; }
th { background: #f0f2f5; }
tr.picked td { background: #fff4e5; font-weight: 600; }
nav { margin: 14px 0 0; font-size: 14px; }
nav a { color: #0969da; text-decoration: none; }
.two { display: grid; grid-template-columns: 1fr 1fr; gap: 16px; }
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
    body = pio.to_html(fig, full_html=False, include_plotlyjs=False, config=PLOT_CONFIG)
    return f'<div class="fig">{body}</div>'


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def key_value_table(rows: list[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_cell(v))}</td></tr>" for k, v in rows
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


def page_html(title: str, header: str, sections: list[Section]) -> str:
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
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head>"
        f"<body><main>{header}<nav>{nav}</nav>{body}</main></body></html>"
    )
