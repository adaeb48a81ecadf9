"""The attribution's section of ``report.html``: per real run, each metric's error in parts."""

from __future__ import annotations

import html
from typing import Any

from lab.report.page import Section
from lab.validate.attribution import PARTS

PART_TITLES = {
    "step_time_model": "step-time model (C - B)",
    "cpu_stages": "CPU and IPC stages (B - A)",
    "scheduling_divergence": "scheduling divergence (A - real)",
}
NOTE = (
    "C: the simulation (modelled steps and stages); B: the run's recorded steps, modelled "
    "stages; A: recorded steps and the run's recorded stages around the scheduler. error = "
    "C - real = (C - B) + (B - A) + (A - real): the parts add up to the total exactly; the "
    "order is a choice (a part is the error removed by recording it once the parts before it "
    "are recorded). Each cell: absolute (ms, or per second for throughputs) and % of real."
)


def _cell(part: dict[str, Any] | None) -> str:
    if part is None:
        return "<td>-</td>"
    rel = "-" if part["rel"] is None else f"{part['rel']:+.1%}"
    return f"<td>{part['abs']:+,.2f} ({rel})</td>"


def _metrics_table(run: dict[str, Any]) -> str:
    head = "<tr><th>metric</th><th>real</th><th>error (C - real)</th>"
    head += "".join(f"<th>{html.escape(PART_TITLES[p])}</th>" for p in PARTS) + "</tr>"
    rows = []
    for key, e in run["metrics"].items():
        real = "-" if e["real"] is None else f"{e['real']:,.2f}"
        cells = _cell(e["total"]) + "".join(_cell(e["parts"][p]) for p in PARTS)
        rows.append(f"<tr><td>{html.escape(key)}</td><td>{real}</td>{cells}</tr>")
    return f"<table>{head}{''.join(rows)}</table>"


def _steps_table(steps: dict[str, Any]) -> str:
    head = ("<tr><th>steps</th><th>n</th><th>recorded ms</th><th>model ms</th><th>error</th>"
            "<th>device error</th></tr>")  # fmt: skip
    groups = [("all", steps["all"])] if steps["all"] else []
    groups += [(f"kind {k}", v) for k, v in steps["by_kind"].items()]
    groups += [(f"batch {k}", v) for k, v in steps["by_batch"].items()]
    rows = []
    for name, g in groups:
        s, d = g["step"], g["device"]

        def pct(x: float | None) -> str:
            return "-" if x is None else f"{x:+.1%}"

        rows.append(
            f"<tr><td>{html.escape(name)}</td><td>{s['n']}</td><td>{s['recorded_ms']:.3f}</td>"
            f"<td>{s['model_ms']:.3f}</td><td>{pct(s['error'])}</td><td>{pct(d['error'])}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def attribution_section(attribution: dict[str, Any]) -> Section:
    """The section: a table of parts and a table of the cost model's step errors per run, or
    the note saying why there is no attribution."""
    if "runs" not in attribution:
        return Section("Where the error comes from", html.escape(attribution["note"]), "")
    body = []
    for name, run in attribution["runs"].items():
        if "replicas" in run:  # several replicas: the step tables only
            for k, steps in run["replicas"].items():
                body.append(
                    f"<h3>{html.escape(name)}, replica {html.escape(k)}</h3><p class='note'>The "
                    f"cost model ({html.escape(steps['model'])}) on the replica's recorded "
                    "plans: error = sum(model) / sum(recorded) - 1</p>"
                )
                body.append(_steps_table(steps))
            continue
        plans = run["plans"]
        body.append(
            f"<h3>{html.escape(name)}</h3><p class='note'>{plans['A']['matched']} of A's "
            f"{plans['A']['matched'] + plans['A']['unmatched']} steps matched a recorded step "
            f"({plans['recorded_steps']} recorded); the others were priced by the corrected "
            "model</p>"
        )
        body.append(_metrics_table(run))
        body.append(
            f"<p class='note'>The cost model ({html.escape(run['steps']['model'])}) on the "
            "recorded plans: error = sum(model) / sum(recorded) - 1</p>"
        )
        body.append(_steps_table(run["steps"]))
    if any("replicas" in run for run in attribution["runs"].values()):
        note = attribution["note"]  # no split into parts: what the tables are
    else:
        note = NOTE + (f" {attribution['note']}" if attribution.get("note") else "")
    return Section("Where the error comes from", html.escape(note), "".join(body))
