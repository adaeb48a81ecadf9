"""The table ``sim replay`` prints: the run, its costs and loop, its latencies, and for a
cluster each replica and the router's decisions."""

from __future__ import annotations

from typing import Any

from sim.costs.reach import reach_warning

PROVENANCE_CHARS = 240
"""The most of a cost model's provenance the terminal shows; summary.json keeps it whole."""


def short_provenance(text: str) -> str:
    """The fit's own figures, without the profile's header lines (hardware, command, grid...)
    that follow them; summary.json keeps the whole text."""
    head = text.split(": hardware:", 1)[0]
    if len(head) > PROVENANCE_CHARS:
        head = head[:PROVENANCE_CHARS].rsplit(" ", 1)[0] + " ..."
    if head == text:
        return text
    return f"{head} (whole: summary.json, cost_model.provenance)"


def format_summary(summary: dict[str, Any]) -> str:
    """The table ``sim replay`` prints (from its ``summary.json``)."""
    cm = summary["cost_model"]
    lines = [
        f"trace        {summary['trace']['path']} ({summary['num_requests']} requests)",
        f"cost model   {cm['name']} (profile: {cm['profile'] or 'none'})",
        f"chosen       {cm.get('chosen', 'as requested')}",
        f"provenance   {short_provenance(cm['provenance'])}",
        *(f"warning      {w}" for w in [reach_warning(cm.get("reach"))] if w),
        f"cpu costs    {summary['cpu_costs']['source']}",
        *(f"overlap      {o}" for o in [summary.get("overlap")] if o),
        f"completed    {summary['completed']}   rejected {summary['rejected']}",
        f"duration     {summary['duration_s']:.1f} s simulated, {summary['num_steps']} steps, "
        f"{summary['wall_s']:.1f} s wall",
        f"throughput   {summary['request_throughput']:.2f} req/s, "
        f"{summary['output_throughput']:.0f} output tok/s, "
        f"{summary['input_throughput']:.0f} input tok/s",
        _goodput_line(summary["goodput"]),
        f"prefix hits  {summary['prefix_hit_rate']:.1%}",
        "",
        f"{'metric':<10}{'mean':>12}{'p50':>12}{'p90':>12}{'p99':>12}",
    ]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = summary[key]
        lines.append(
            f"{key:<10}" + "".join(f"{_fmt(s[q]):>12}" for q in ("mean", "p50", "p90", "p99"))
        )
    if summary.get("router"):
        lines += ["", *_router_lines(summary["router"]), "", *_replica_lines(summary["replicas"])]
    if summary.get("rejected_reasons"):
        lines.append("")
        lines += [f"rejected: {n} x {reason}" for reason, n in summary["rejected_reasons"].items()]
    verdict = summary.get("bottleneck")
    if verdict:
        lines.append("")
        text = verdict.get("text") if isinstance(verdict, dict) else None
        lines.append(f"bottleneck   {text or verdict}")
    return "\n".join(lines)


def _router_lines(router: dict[str, Any]) -> list[str]:
    """The router's policy and its decisions by reason."""
    decisions = router.get("decisions") or {}
    total = sum(decisions.values())
    counts = ", ".join(
        f"{reason} {n} ({n / total:.0%})" for reason, n in decisions.items() if total
    )
    lines = [
        f"router       {router['policy']} (load: {router.get('load')})",
        f"decisions    {counts or 'none'}",
    ]
    if router.get("warning"):
        lines.append(f"warning      {router['warning']}")
    return lines


REPLICA_COLUMNS = (
    ("replica", 8),
    ("requests", 10),
    ("done", 7),
    ("hit rate", 9),
    ("req/s", 8),
    ("out tok/s", 10),
    ("ttft p50", 10),
    ("ttft p99", 10),
    ("tpot p50", 10),
    ("tpot p99", 10),
    ("busy", 6),
)
"""The per-replica table's columns and their widths (latencies in ms)."""


def _replica_lines(replicas: list[dict[str, Any]]) -> list[str]:
    """One row per replica: placed and completed requests, prefix hit rate, throughput, TTFT
    and TPOT P50/P99 (ms), and its busy share."""
    header = "".join(f"{name:>{width}}" for name, width in REPLICA_COLUMNS)
    lines = [header]
    for r in replicas:
        ttft, tpot = r.get("ttft_ms") or {}, r.get("tpot_ms") or {}
        cells = (
            str(r["replica"]),
            str(r["requests"]),
            str(r["completed"]),
            f"{r['prefix_hit_rate']:.1%}",
            f"{r['request_throughput']:.2f}",
            f"{r['output_throughput']:.0f}",
            _fmt(ttft.get("p50")),
            _fmt(ttft.get("p99")),
            _fmt(tpot.get("p50")),
            _fmt(tpot.get("p99")),
            f"{r['busy_share']:.0%}",
        )
        lines.append("".join(f"{c:>{w}}" for c, (_, w) in zip(cells, REPLICA_COLUMNS, strict=True)))
    return lines


def _goodput_line(goodput: dict[str, Any]) -> str:
    slos = [
        f"{name} <= {goodput[key]:g} ms"
        for name, key in (("ttft", "slo_ttft_ms"), ("tpot", "slo_tpot_ms"))
        if goodput.get(key) is not None
    ]
    if not slos:
        return "goodput      - (no SLO given: --slo-ttft-ms, --slo-tpot-ms)"
    return f"goodput      {goodput['value']:.2f} req/s ({', '.join(slos)})"


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    return f"{v:,.1f}" if isinstance(v, float) else str(v)
