"""Prometheus metrics of one server: the core's counters and per-request latencies.

Gauges mirror the scheduler's ``StatsUpdate``; histograms are observed from
the stage timestamps the pipeline carries (TTFT = first token - received,
ITL = gap between consecutive tokens, queue = first scheduled - received,
E2E = finished - received).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import messages
from engine.scheduler.config import SchedulerStats

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


# the gauges that mirror the scheduler core's counters: name, help, value
STATS_GAUGES: tuple[tuple[str, str, Callable[[SchedulerStats], float]], ...] = (
    ("engine_num_running_requests", "Requests holding KV", lambda s: s.num_running),
    ("engine_num_waiting_requests", "Requests queued", lambda s: s.num_waiting),
    ("engine_kv_pages_total", "KV pages in the pool", lambda s: s.num_pages),
    ("engine_kv_pages_used", "KV pages allocated (held or cached)", lambda s: s.pages_used),
    ("engine_kv_pages_cached", "Evictable pages in the prefix cache", lambda s: s.pages_cached),
    ("engine_kv_pages_held", "KV pages held by live requests", lambda s: s.pages_held),
    ("engine_prefix_cache_hit_rate", "Cached over prompt tokens", lambda s: s.prefix_hit_rate),
)

M = TypeVar("M", Counter, Gauge, Histogram)


class ServerMetrics:
    """The metrics of one server, each labelled with the model it serves."""

    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        self.model = model
        self.stats_gauges = [
            (self._metric(Gauge, name, help_), value) for name, help_, value in STATS_GAUGES
        ]
        self.prompt_tokens = self._metric(
            Counter, "engine_prompt_tokens", "Prompt tokens of started requests"
        )
        self.generation_tokens = self._metric(
            Counter, "engine_generation_tokens", "Generated tokens"
        )
        self.aborted = self._metric(
            Counter, "engine_requests_aborted", "Requests aborted by clients"
        )
        self.finished = Counter(
            "engine_requests_finished",
            "Finished requests",
            ["model", "reason"],
            registry=self.registry,
        )
        self.ttft = self._latency("engine_time_to_first_token_seconds", "TTFT")
        self.itl = self._latency("engine_inter_token_latency_seconds", "ITL")
        self.queue = self._latency("engine_queue_time_seconds", "First scheduled - received")
        self.e2e = self._latency("engine_e2e_request_latency_seconds", "E2E")

    def _metric(self, kind: type[M], name: str, help_: str, **kwargs: Any) -> M:
        """A new metric of ``kind``; the returned child is the one of this server's model."""
        metric = kind(name, help_, ["model"], registry=self.registry, **kwargs)
        return metric.labels(self.model)

    def _latency(self, name: str, help_: str) -> Histogram:
        return self._metric(Histogram, name, help_, buckets=LATENCY_BUCKETS)

    def on_item(
        self, received: float, last_token_time: float | None, item: messages.TextItem
    ) -> float | None:
        """Observe one output item; returns the time of the request's latest token."""
        if item.prompt_tokens:
            self.prompt_tokens.inc(item.prompt_tokens)
        if item.first_scheduled is not None:
            self.queue.observe(max(0.0, item.first_scheduled - received))
        if item.token_ids:
            self.generation_tokens.inc(len(item.token_ids))
        for t in item.token_times:
            if last_token_time is None:
                self.ttft.observe(max(0.0, t - received))
            else:
                self.itl.observe(max(0.0, t - last_token_time))
            last_token_time = t
        if item.finish_reason is not None and item.error is None:
            self.finished.labels(self.model, item.finish_reason).inc()
            end = item.finished or last_token_time or received
            self.e2e.observe(max(0.0, end - received))
        return last_token_time

    def on_aborted(self) -> None:
        self.aborted.inc()

    def on_stats(self, update: messages.StatsUpdate) -> None:
        for gauge, value in self.stats_gauges:
            gauge.set(value(update.stats))

    def render(self) -> bytes:
        return generate_latest(self.registry)
