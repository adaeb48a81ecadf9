"""Prometheus metrics of one server, named as vLLM names them (``vllm:X`` is ``engine_X``).

Gauges and the prefix-cache and preemption counters mirror each replica's
scheduler (its ``StatsUpdate``) and carry the label ``replica``; the other
counters and the histograms are observed by the frontend from the stage
timestamps the pipeline carries (TTFT = first token - received, ITL = gap
between consecutive tokens, queue time = first scheduled - received, E2E =
finished - received). Every series has the label ``model_name``. The router's
books per replica come from ``engine.server.replica_metrics``; a speculating
server's drafts, from ``engine.server.speculative_metrics``; a prefill or decode
server's KV transfers, from ``engine.server.transfer_metrics``.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from core.scheduler.config import SchedulerStats
from engine.ipc import messages
from engine.server.replica_metrics import ReplicaCollector
from engine.server.replicas import Replicas
from engine.server.speculative_metrics import SpeculativeCollector
from engine.server.transfer_metrics import TransferCollector

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75,
    1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)

# the gauges that mirror the scheduler core's counters: name, help, value
STATS_GAUGES: tuple[tuple[str, str, Callable[[SchedulerStats], float]], ...] = (
    ("engine_num_requests_running", "Requests holding KV pages", lambda s: s.num_running),
    ("engine_num_requests_waiting", "Requests queued in the scheduler", lambda s: s.num_waiting),
    (
        "engine_kv_cache_usage_perc",
        "Fraction of KV pages held by requests (1 = full; evictable cache pages count as free)",
        lambda s: s.pages_held / s.num_pages if s.num_pages else 0.0,
    ),
    ("engine_kv_pages_total", "KV pages in the pool", lambda s: s.num_pages),
    ("engine_kv_pages_used", "KV pages allocated (held or cached)", lambda s: s.pages_used),
    ("engine_kv_pages_cached", "Evictable pages in the prefix cache", lambda s: s.pages_cached),
    ("engine_kv_pages_held", "KV pages held by live requests", lambda s: s.pages_held),
    ("engine_prefix_cache_hit_rate", "Cached over prompt tokens", lambda s: s.prefix_hit_rate),
    ("engine_kv_host_pages_total", "Pages of the host KV tier (0: none)", lambda s: s.host_pages),
    ("engine_kv_host_pages_used", "Host KV tier pages holding KV", lambda s: s.host_pages_used),
)

M = TypeVar("M", Counter, Gauge, Histogram)


class ServerMetrics:
    """The metrics of one server, each labelled with the model it serves."""

    def __init__(self, model: str, num_draft_tokens: int = 0, transfers: bool = False) -> None:
        """``num_draft_tokens``: the longest draft of a speculating server (0: none);
        ``transfers``: a prefill or decode server's, whose KV moves."""
        self.registry = CollectorRegistry()
        self.model = model
        self.speculative: SpeculativeCollector | None = None
        if num_draft_tokens:
            self.speculative = SpeculativeCollector(model, num_draft_tokens)
            self.registry.register(self.speculative)
        self.transfers = TransferCollector(model) if transfers else None
        if self.transfers is not None:
            self.registry.register(self.transfers)
        self.stats_gauges = [
            (self._per_replica(Gauge, name, help_), value) for name, help_, value in STATS_GAUGES
        ]
        self.prefix_queries = self._per_replica(
            Counter, "engine_prefix_cache_queries", "Prompt tokens looked up in the cache"
        )
        self.prefix_hits = self._per_replica(
            Counter, "engine_prefix_cache_hits", "Prompt tokens found in the prefix cache"
        )
        self.external_hits = self._per_replica(
            Counter,
            "engine_external_prefix_cache_hits",
            "Prompt tokens found in the host KV tier (loaded; part of prefix_cache_hits)",
        )
        self.host_loaded = self._per_replica(
            Counter, "engine_kv_host_loaded_tokens", "KV tokens loaded from the host tier"
        )
        self.host_written = self._per_replica(
            Counter, "engine_kv_host_written_tokens", "KV tokens written to the host tier"
        )
        self.host_load_s = self._per_replica(
            Counter, "engine_kv_host_load_seconds", "Time spent loading from the host tier"
        )
        self.preemptions = self._per_replica(
            Counter, "engine_num_preemptions", "Requests preempted (KV pages ran out)"
        )
        counter = self._counter
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of started requests")
        self.generation_tokens = counter("generation_tokens", "Generated tokens")
        self.aborted = counter("requests_aborted", "Requests aborted by clients")
        self.timed_out = counter("requests_timed_out", "Requests past --request-timeout")
        self.success = self._labelled("request_success", "Finished requests", "finished_reason")
        self.rejected = self._labelled("requests_rejected", "Requests refused (503/429)", "reason")
        self.open_requests = self._metric(
            Gauge, "engine_num_requests_open", "Requests the frontend holds a connection for"
        )
        self.ttft = self._latency("engine_time_to_first_token_seconds", "TTFT")
        self.itl = self._latency("engine_inter_token_latency_seconds", "ITL")
        self.queue = self._latency(
            "engine_request_queue_time_seconds", "First scheduled - received"
        )
        self.e2e = self._latency("engine_e2e_request_latency_seconds", "E2E")
        self.prompt_len = self._metric(
            Histogram, "engine_request_prompt_tokens", "Prompt tokens", buckets=TOKEN_BUCKETS
        )
        self.output_len = self._metric(
            Histogram,
            "engine_request_generation_tokens",
            "Generated tokens of finished requests",
            buckets=TOKEN_BUCKETS,
        )
        gc_frozen = self._metric(
            Gauge,
            "engine_gc_frozen_objects",
            "Objects of the frontend process frozen out of garbage collection after start-up "
            "(0 with --no-gc-freeze)",
        )
        gc_frozen.set_function(gc.get_freeze_count)
        self._last_stats: dict[int, messages.StatsUpdate] = {}  # by replica

    def _metric(self, kind: type[M], name: str, help_: str, **kwargs: Any) -> M:
        """A new metric of ``kind``; the returned child is the one of this server's model."""
        metric = kind(name, help_, ["model_name"], registry=self.registry, **kwargs)
        return metric.labels(self.model)

    def _per_replica(self, kind: type[M], name: str, help_: str) -> M:
        """A new metric of ``kind`` with the labels ``model_name`` and ``replica``."""
        return kind(name, help_, ["model_name", "replica"], registry=self.registry)

    def _counter(self, name: str, help_: str) -> Counter:
        return self._metric(Counter, f"engine_{name}", help_)

    def _labelled(self, name: str, help_: str, label: str) -> Counter:
        return Counter(f"engine_{name}", help_, ["model_name", label], registry=self.registry)

    def _latency(self, name: str, help_: str) -> Histogram:
        return self._metric(Histogram, name, help_, buckets=LATENCY_BUCKETS)

    def on_item(
        self, received: float, last_token_time: float | None, item: messages.TextItem
    ) -> float | None:
        """Observe one output item; returns the time of the request's latest token."""
        if item.prompt_tokens:
            self.prompt_tokens.inc(item.prompt_tokens)
            self.prompt_len.observe(item.prompt_tokens)
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
        return last_token_time

    def on_finished(self, received: float, result: messages.RequestOutput) -> None:
        """Observe a request that finished (not one that failed)."""
        if result.finish_reason is None:
            return
        self.success.labels(self.model, result.finish_reason).inc()
        self.output_len.observe(len(result.token_ids))
        end = result.finished or (result.token_times[-1] if result.token_times else received)
        self.e2e.observe(max(0.0, end - received))

    def on_aborted(self) -> None:
        self.aborted.inc()

    def on_timeout(self) -> None:
        self.timed_out.inc()

    def on_rejected(self, reason: str) -> None:
        self.rejected.labels(self.model, reason).inc()

    def on_stats(self, update: messages.StatsUpdate) -> None:
        stats, labels = update.stats, (self.model, str(update.replica))
        for gauge, value in self.stats_gauges:
            gauge.labels(*labels).set(value(stats))
        last = self._last_stats.get(update.replica)
        before = last.stats if last else None
        for metric, now, then in (
            (self.prefix_queries, stats.prompt_tokens, before.prompt_tokens if before else 0),
            (self.prefix_hits, stats.cached_tokens, before.cached_tokens if before else 0),
            (self.external_hits, stats.host_hit_tokens, before.host_hit_tokens if before else 0),
            (
                self.host_loaded,
                stats.host_loaded_tokens,
                before.host_loaded_tokens if before else 0,
            ),
            (
                self.host_written,
                stats.host_written_tokens,
                before.host_written_tokens if before else 0,
            ),
            (self.host_load_s, update.host_load_s, last.host_load_s if last else 0.0),
            (self.preemptions, update.num_preemptions, last.num_preemptions if last else 0),
        ):
            metric.labels(*labels).inc(now - then)
        self._last_stats[update.replica] = update
        if self.speculative is not None and update.speculative is not None:
            self.speculative.update(update.replica, update.speculative)
        if self.transfers is not None and update.transfers is not None:
            self.transfers.update(update.replica, update.transfers)

    def track_open(self, count: Callable[[], int]) -> None:
        """Report ``count()`` as the number of open requests at each scrape."""
        self.open_requests.set_function(count)

    def track_replicas(self, replicas: Replicas, pools: Mapping[int, tuple[int, int]]) -> None:
        """Report the router's books per replica at each scrape; every replica's scheduler
        series start at zero but its pool sizes, which ``pools`` (replica -> KV pages, host
        KV pages, as its scheduler reported them ready) gives before the first
        ``StatsUpdate`` arrives."""
        self.registry.register(ReplicaCollector(self.model, replicas))
        metrics = [g for g, _ in self.stats_gauges]
        for replica in replicas.core.workers:
            for metric in (*metrics, self.prefix_queries, self.prefix_hits, self.preemptions):
                metric.labels(self.model, replica)
        for index, (pages, host_pages) in pools.items():
            idle = SchedulerStats(
                num_pages=pages,
                pages_used=0,
                pages_free=pages,
                pages_cached=0,
                num_waiting=0,
                num_running=0,
                prompt_tokens=0,
                cached_tokens=0,
                host_pages=host_pages,
            )
            for gauge, value in self.stats_gauges:
                gauge.labels(self.model, str(index)).set(value(idle))

    def render(self) -> bytes:
        return generate_latest(self.registry)
