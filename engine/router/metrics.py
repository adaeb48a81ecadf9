"""``GET /metrics`` of the router: Prometheus text, one series per worker.

Behind a prefill/decode router every series also says the worker's ``role``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from engine.router.service import RouterService

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(services: Sequence[RouterService]) -> str:
    lines: list[str] = []

    def role(service: RouterService) -> str:
        return f',role="{service.role}"' if service.role else ""

    def family(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.extend((f"# HELP {name} {help_}", f"# TYPE {name} {kind}"))
        lines.extend(f"{name}{labels} {value:g}" for labels, value in samples)

    def per_worker(value: str) -> list[tuple[str, float]]:
        return [
            (f'{{worker="{s.worker}"{role(svc)}}}', float(getattr(s, value)))
            for svc in services
            for s in svc.core.stats()
        ]

    family(
        "router_requests_routed_total",
        "counter",
        "Requests sent to each worker.",
        per_worker("routed"),
    )
    family(
        "router_requests_finished_total",
        "counter",
        "Requests each worker completed.",
        per_worker("finished"),
    )
    family(
        "router_requests_aborted_total",
        "counter",
        "Requests that ended early on each worker (client gone, worker failed).",
        per_worker("aborted"),
    )
    family(
        "router_outstanding_requests",
        "gauge",
        "Open requests on each worker.",
        per_worker("outstanding_requests"),
    )
    family(
        "router_outstanding_tokens",
        "gauge",
        "Prompt (estimated) plus maximum output tokens of the open requests on each worker.",
        per_worker("outstanding_tokens"),
    )
    family(
        "router_worker_healthy",
        "gauge",
        "1 while a worker gets new requests.",
        [
            (
                f'{{worker="{s.worker}",state="{s.health.value}"{role(svc)}}}',
                float(s.health == "healthy"),
            )
            for svc in services
            for s in svc.core.stats()
        ],
    )
    family(
        "router_worker_failures_total",
        "counter",
        "Times each worker was found down.",
        [
            (f'{{worker="{w}"{role(svc)}}}', float(svc.worker_failures[w]))
            for svc in services
            for w in svc.core.workers
        ],
    )
    family(
        "router_decisions_total",
        "counter",
        "Routing decisions by the policy's reason.",
        [
            (f'{{policy="{svc.core.config.policy}",reason="{r}"{role(svc)}}}', float(n))
            for svc in services
            for r, n in sorted(svc.core.decisions.items())
        ],
    )
    rejected = sum((svc.rejected for svc in services), Counter[str]())
    family(
        "router_requests_rejected_total",
        "counter",
        "Requests the router answered itself.",
        [(f'{{reason="{r}"}}', float(n)) for r, n in sorted(rejected.items())],
    )
    return "\n".join(lines) + "\n"
