"""Prometheus metrics of one server: the core's counters and per-request latencies.

Gauges mirror the scheduler's ``StatsUpdate``; histograms are observed from
the stage timestamps the pipeline carries (TTFT = first token - received,
ITL = gap between consecutive tokens, queue = first scheduled - received,
E2E = finished - received).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine import messages

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class ServerMetrics:
    def __init__(self, model: str) -> None:
        self.registry = CollectorRegistry()
        r, labels = self.registry, ["model"]
        self.num_running = Gauge(
            "engine_num_running_requests", "Requests holding KV", labels, registry=r
        )
        self.num_waiting = Gauge(
            "engine_num_waiting_requests", "Requests queued", labels, registry=r
        )
        self.pages_total = Gauge(
            "engine_kv_pages_total", "KV pages in the pool", labels, registry=r
        )
        self.pages_used = Gauge(
            "engine_kv_pages_used", "KV pages allocated (held or cached)", labels, registry=r
        )
        self.pages_cached = Gauge(
            "engine_kv_pages_cached", "Evictable pages in the prefix cache", labels, registry=r
        )
        self.pages_held = Gauge(
            "engine_kv_pages_held", "KV pages held by live requests", labels, registry=r
        )
        self.hit_rate = Gauge(
            "engine_prefix_cache_hit_rate", "Cached over prompt tokens", labels, registry=r
        )
        self.prompt_tokens = Counter(
            "engine_prompt_tokens", "Prompt tokens of started requests", labels, registry=r
        )
        self.generation_tokens = Counter(
            "engine_generation_tokens", "Generated tokens", labels, registry=r
        )
        self.finished = Counter(
            "engine_requests_finished", "Finished requests", [*labels, "reason"], registry=r
        )
        self.aborted = Counter(
            "engine_requests_aborted", "Requests aborted by clients", labels, registry=r
        )
        self.ttft = Histogram(
            "engine_time_to_first_token_seconds",
            "TTFT",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "engine_inter_token_latency_seconds", "ITL", labels, buckets=LATENCY_BUCKETS, registry=r
        )
        self.queue = Histogram(
            "engine_queue_time_seconds",
            "First scheduled - received",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "engine_e2e_request_latency_seconds", "E2E", labels, buckets=LATENCY_BUCKETS, registry=r
        )
        self.model = model
        for metric in (
            self.num_running, self.num_waiting, self.pages_total, self.pages_used,
            self.pages_cached, self.pages_held, self.hit_rate, self.prompt_tokens,
            self.generation_tokens, self.aborted, self.ttft, self.itl, self.queue, self.e2e,
        ):  # fmt: skip
            metric.labels(model)

    def on_item(
        self, received: float, last_token_time: float | None, item: messages.TextItem
    ) -> float | None:
        """Observe one output item; returns the time of the request's latest token."""
        m = self.model
        if item.prompt_tokens:
            self.prompt_tokens.labels(m).inc(item.prompt_tokens)
        if item.first_scheduled is not None:
            self.queue.labels(m).observe(max(0.0, item.first_scheduled - received))
        if item.token_ids:
            self.generation_tokens.labels(m).inc(len(item.token_ids))
        for t in item.token_times:
            if last_token_time is None:
                self.ttft.labels(m).observe(max(0.0, t - received))
            else:
                self.itl.labels(m).observe(max(0.0, t - last_token_time))
            last_token_time = t
        if item.finish_reason is not None and item.error is None:
            self.finished.labels(m, item.finish_reason).inc()
            end = item.finished or last_token_time or received
            self.e2e.labels(m).observe(max(0.0, end - received))
        return last_token_time

    def on_aborted(self) -> None:
        self.aborted.labels(self.model).inc()

    def on_stats(self, s: messages.StatsUpdate) -> None:
        m = self.model
        self.num_running.labels(m).set(s.num_running)
        self.num_waiting.labels(m).set(s.num_waiting)
        self.pages_total.labels(m).set(s.num_pages)
        self.pages_used.labels(m).set(s.pages_used)
        self.pages_cached.labels(m).set(s.pages_cached)
        self.pages_held.labels(m).set(s.pages_used - s.pages_cached)
        self.hit_rate.labels(m).set(s.cached_tokens / s.prompt_tokens if s.prompt_tokens else 0.0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
