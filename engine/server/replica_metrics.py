"""``/metrics`` series of the router's books, one per replica, read at each scrape."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypeAlias

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.server.replicas import Replicas

LABELS = ["model_name", "replica"]
Family: TypeAlias = type[CounterMetricFamily] | type[GaugeMetricFamily]


class ReplicaCollector(Collector):
    """``engine_replica_requests_{routed,finished,aborted}_total``,
    ``engine_replica_outstanding_{requests,tokens}`` and ``engine_replica_healthy``."""

    def __init__(self, model: str, replicas: Replicas) -> None:
        self.model = model
        self.replicas = replicas

    def collect(self) -> Iterator[Metric]:
        stats = self.replicas.core.stats()
        families: list[tuple[Family, str, str, str]] = [
            (CounterMetricFamily, "routed", "requests_routed", "Requests the router placed"),
            (CounterMetricFamily, "finished", "requests_finished", "Requests that completed"),
            (
                CounterMetricFamily,
                "aborted",
                "requests_aborted",
                "Requests that ended early (client gone, timed out, failed, replica down)",
            ),
            (
                GaugeMetricFamily,
                "outstanding_requests",
                "outstanding_requests",
                "Open requests the router counts on the replica",
            ),
            (
                GaugeMetricFamily,
                "outstanding_tokens",
                "outstanding_tokens",
                "Prompt (estimated) plus maximum output tokens of the open requests",
            ),
        ]
        for kind, field, name, help_ in families:
            family = kind(f"engine_replica_{name}", help_, labels=LABELS)
            for s in stats:
                family.add_metric([self.model, s.worker], float(getattr(s, field)))
            yield family
        healthy = GaugeMetricFamily(
            "engine_replica_healthy", "1 while the replica gets new requests", labels=LABELS
        )
        for s in stats:
            healthy.add_metric([self.model, s.worker], float(s.health == "healthy"))
        yield healthy
