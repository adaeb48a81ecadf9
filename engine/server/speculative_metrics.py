"""``/metrics`` series of speculative decoding, from each replica's ``SpeculativeStats``.

Named as vLLM names its counters (``vllm:spec_decode_num_drafts`` is
``engine_spec_decode_num_drafts``); the histogram of accepted draft tokens per
verify slot has one bucket per count, 0 to ``--num-draft-tokens``; the counter
``engine_spec_decode_num_tested_tokens_per_pos`` (label ``position``, from 0, as
vLLM's per-position counter) counts the slots whose draft token at that position
was tested: the slot's draft reached it and accepted every token before it.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import accumulate

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.ipc.messages import SpeculativeStats

LABELS = ["model_name", "replica"]
COUNTERS = (
    ("num_drafts", "verify_slots", "Decode slots that verified a draft"),
    ("num_undrafted_slots", "undrafted_slots", "Decode slots that carried no draft"),
    ("num_draft_tokens", "draft_tokens", "Draft tokens proposed for verification"),
    ("num_accepted_tokens", "accepted_tokens", "Draft tokens the model accepted"),
)


class SpeculativeCollector(Collector):
    """The counters and the accepted-length histogram, read from the latest stats per replica
    (``update``) at each scrape."""

    def __init__(self, model: str, num_draft_tokens: int) -> None:
        self.model = model
        self.num_draft_tokens = num_draft_tokens
        self.latest: dict[int, SpeculativeStats] = {}

    def update(self, replica: int, stats: SpeculativeStats) -> None:
        self.latest[replica] = stats

    def collect(self) -> Iterator[Metric]:
        replicas = sorted(self.latest.items())
        for name, field, help_ in COUNTERS:
            family = CounterMetricFamily(f"engine_spec_decode_{name}", help_, labels=LABELS)
            for replica, stats in replicas:
                family.add_metric([self.model, str(replica)], float(getattr(stats, field)))
            yield family
        histogram = HistogramMetricFamily(
            "engine_spec_decode_accepted_length",
            "Draft tokens accepted per verify slot",
            labels=LABELS,
        )
        for replica, stats in replicas:
            counts = list(stats.accepted_lengths)
            counts += [0] * (self.num_draft_tokens + 1 - len(counts))
            cumulative = list(accumulate(counts))
            buckets = [(str(n), float(c)) for n, c in enumerate(cumulative)]
            buckets.append(("+Inf", float(cumulative[-1])))
            histogram.add_metric(
                [self.model, str(replica)], buckets, sum_value=float(stats.accepted_tokens)
            )
        yield histogram
        tested = CounterMetricFamily(
            "engine_spec_decode_num_tested_tokens_per_pos",
            "Verify slots whose draft token at this position was tested (the draft that long, "
            "every token before it accepted)",
            labels=[*LABELS, "position"],
        )
        for replica, stats in replicas:
            counts = list(stats.tested_per_position)
            counts += [0] * (self.num_draft_tokens - len(counts))
            for i, count in enumerate(counts):
                tested.add_metric([self.model, str(replica), str(i)], float(count))
        yield tested
