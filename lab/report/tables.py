"""Tables of the report: the evidence behind the verdict, and the run's configuration."""

from __future__ import annotations

import html
from typing import Any

from lab.report.page import fmt, key_value_table
from lab.report.verdict import (
    GPU_BUSY_FRACTION,
    LIMIT_STEP_FRACTION,
    QUEUE_TAIL_MS,
    QUEUE_TAIL_SHARE,
    TOKENIZER_TTFT_SHARE,
    WAITING_STEP_FRACTION,
)
from schema.frames import as_float

STEP_FIGURES = (
    ("kv_memory", "steps blocked by KV memory or preempting"),
    ("running_cap", "steps held at the running cap"),
    ("prefill_budget", "steps blocked by the prefill budget"),
)
"""The admission limits, scored as fractions of steps, and what each score counts."""


def evidence_table(verdict: dict[str, Any]) -> str:
    """Each limit's figure against its threshold (the binding one highlighted), then context."""
    ev, scores = verdict["evidence"], verdict["limit_scores"]

    def pct(x: Any) -> str:
        f = as_float(x)
        return "n/a" if f is None else f"{100 * f:.1f}%"

    rows = [
        (
            "tokenizer",
            "tokenizer queue share of mean TTFT",
            pct(ev["tokenizer_queue_share_of_ttft"]),
            f">= {pct(TOKENIZER_TTFT_SHARE)}",
        ),
        *((k, what, pct(scores[k]), f">= {pct(LIMIT_STEP_FRACTION)}") for k, what in STEP_FIGURES),
        (
            "gpu_compute",
            "engine busy / steps with requests waiting",
            f"{pct(ev['busy_fraction'])} / {pct(ev['waiting_step_fraction'])}",
            f">= {pct(GPU_BUSY_FRACTION)} / >= {pct(WAITING_STEP_FRACTION)}",
        ),
        (
            "queueing",
            "TTFT P99 beyond the prompt's own prefill / TTFT P99",
            f"{fmt(ev['queue_delay_p99_ms'], 0, 'ms')} / {fmt(ev['ttft_p99_ms'], 0, 'ms')}",
            f">= {fmt(QUEUE_TAIL_MS, 0, 'ms')} and >= {pct(QUEUE_TAIL_SHARE)} of it",
        ),
    ]
    head = "<tr><th>limit</th><th>figure</th><th>value</th><th>binds at</th></tr>"
    picked = ' class="picked"'
    body = "".join(
        f"<tr{picked if k == verdict['binding_limit'] else ''}>"
        f"<td>{html.escape(k)}</td><td>{html.escape(what)}</td><td>{v}</td><td>{t}</td></tr>"
        for k, what, v, t in rows
    )
    extra = [
        (
            "KV pages peak / mean use",
            f"{pct(ev['kv_peak_utilization'])} / "
            f"{pct(ev['kv_mean_utilization'])} of {fmt(ev['kv_pages_total'], 0)}",
        ),
        ("preemptions", fmt(ev["preemptions"], 0)),
        ("steps labelled running_cap below the cap", pct(ev["running_cap_below_cap_fraction"])),
        ("scheduler wait share of mean TTFT", pct(ev["scheduler_wait_share_of_ttft"])),
        ("rejected requests", pct(ev["rejected_fraction"])),
    ]
    for stage, q in sorted(ev["queues"].items()):
        extra.append((f"{stage} queue mean / max", f"{fmt(q['mean'], 2)} / {fmt(q['max'], 0)}"))
    return f"<div class='two'><table>{head}{body}</table>{key_value_table(extra)}</div>"


METRIC_KEYS = ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "goodput", "bottleneck")


def config_tables(summary: dict[str, Any]) -> str:
    """``config`` and every other dict of the summary (cost models, trace, ...) as tables."""
    keys = sorted(
        (k for k, v in summary.items() if isinstance(v, dict) and v and k not in METRIC_KEYS),
        key=lambda k: (k != "config", k),
    )
    tables = [
        f"<div><b>{html.escape(key)}</b>{key_value_table(sorted(summary[key].items()))}</div>"
        for key in keys
    ]
    return f"<div class='two'>{''.join(tables) or 'no configuration in summary.json'}</div>"
