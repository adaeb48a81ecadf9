"""``/metrics`` series of a prefill or decode server's KV transfers, from each replica's
``TransferStats`` (``engine.scheduler_proc.pd``).

A prefill server counts what it sent (seconds: from the send to the acknowledgment), a
decode server what it received (seconds: writing the pages into its pool); the bytes and
seconds are of the transfers that ended ``ok``, summed over requests.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.ipc.messages import TransferStats

LABELS = ["model_name", "replica"]


class TransferCollector(Collector):
    """The transfer counters and gauges, read from the latest stats per replica (``update``)
    at each scrape."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.latest: dict[int, TransferStats] = {}

    def update(self, replica: int, stats: TransferStats) -> None:
        self.latest[replica] = stats

    def collect(self) -> Iterator[Metric]:
        replicas = sorted(self.latest.items())
        ended = CounterMetricFamily(
            "engine_kv_transfers", "KV transfers ended, by status", labels=[*LABELS, "status"]
        )
        nbytes = CounterMetricFamily(
            "engine_kv_transfer_bytes", "KV bytes of the transfers that ended ok", labels=LABELS
        )
        seconds = CounterMetricFamily(
            "engine_kv_transfer_seconds",
            "Seconds of the transfers that ended ok (prefill: send to acknowledgment; "
            "decode: writing the pages)",
            labels=LABELS,
        )
        ipc = CounterMetricFamily(
            "engine_kv_transfers_cuda_ipc",
            "KV transfers that ended ok device to device through CUDA IPC (the others of them "
            "went through host memory)",
            labels=LABELS,
        )
        open_ = GaugeMetricFamily(
            "engine_pd_open_handoffs",
            "Hand-offs open: waiting for their other half, an answer or their KV",
            labels=LABELS,
        )
        pages = GaugeMetricFamily(
            "engine_kv_pages_in_transfer",
            "KV pages held for a transfer (prefill) or reserved for one (decode)",
            labels=LABELS,
        )
        for replica, stats in replicas:
            labels = [self.model, str(replica)]
            for status, n in sorted(stats.ended.items()):
                ended.add_metric([*labels, status], float(n))
            nbytes.add_metric(labels, float(stats.nbytes))
            seconds.add_metric(labels, stats.seconds)
            ipc.add_metric(labels, float(stats.cuda_ipc))
            open_.add_metric(labels, float(stats.open_handoffs))
            pages.add_metric(labels, float(stats.pages_in_transfer))
        yield from (ended, nbytes, seconds, ipc, open_, pages)
