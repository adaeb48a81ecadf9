"""The pure parts of ``benchmarks/speculative.py``, ``speculative_real.py`` and
``speculative_sim.py``: the workloads, the ``/metrics`` histogram and counters read into
counts and their deltas (the draft share among them), the closed loop's arrivals, the speed-up
and error arithmetic, the crossover and the synthetic method's flags. No server: the
benchmark itself is run by hand."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from prometheus_client import CollectorRegistry, generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import serving_load
from speculative import (
    CHAT_PROMPTS,
    COPY_FUNCTIONS,
    SYNTHETIC_OUTPUT,
    chat_prompts,
    copy_prompts,
    crossovers,
    one_case,
)
from speculative_real import acceptance_delta, accepted_histogram, differences, speculative_args
from speculative_sim import (
    acceptance_figures,
    closed_loop_arrivals,
    priced_steps,
    relative_error,
    seed_means,
    speedup,
    think_gaps,
    throughput,
)

from core.scheduler.shape import StepShape
from engine.ipc.messages import SpeculativeStats
from engine.server.speculative_metrics import SpeculativeCollector
from lab.profile.grid import StepPoint
from schema.steprecord import SHAPE_COLUMNS
from sim.costs import TableCostModel, read_profile

ROOT = Path(__file__).resolve().parents[1]


def scraped(
    monkeypatch: pytest.MonkeyPatch, k: int, *replicas: SpeculativeStats
) -> dict[str, float]:
    """``scrape``'s samples of a ``/metrics`` page holding the speculative collector's series
    with ``replicas``' stats (none: the collector before its first update)."""
    registry = CollectorRegistry()
    collector = SpeculativeCollector("m", k)
    for i, stats in enumerate(replicas):
        collector.update(i, stats)
    registry.register(collector)
    page = generate_latest(registry).decode()
    monkeypatch.setattr(httpx, "get", lambda *a, **kw: httpx.Response(200, text=page))
    return serving_load.scrape("http://test")


def test_the_metrics_histogram_reads_into_counts_summed_over_replicas(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = SpeculativeStats(10, 40, 17, [3, 2, 1, 0, 4])
    two = SpeculativeStats(5, 20, 6, [1, 1, 2, 1])  # padded to K + 1 by the collector
    assert accepted_histogram(scraped(monkeypatch, 4, one)) == [3, 2, 1, 0, 4]
    assert accepted_histogram(scraped(monkeypatch, 4, one, two)) == [4, 3, 3, 1, 4]
    assert accepted_histogram(scraped(monkeypatch, 4)) == []  # no stats yet
    assert accepted_histogram({"engine_num_requests_running": 0.0}) == []  # a plain server


def test_the_delta_of_two_scrapes_is_what_the_run_drafted(monkeypatch: pytest.MonkeyPatch) -> None:
    before = scraped(monkeypatch, 2)
    middle = scraped(monkeypatch, 2, SpeculativeStats(4, 8, 3, [2, 1, 1], 12))
    after = scraped(monkeypatch, 2, SpeculativeStats(10, 19, 9, [4, 3, 3], 14))
    first = acceptance_delta(before, middle)
    assert first["accepted_lengths"] == [2, 1, 1]
    assert (first["verify_slots"], first["draft_tokens"], first["accepted_tokens"]) == (4, 8, 3)
    assert first["undrafted_slots"] == 12 and first["draft_share"] == pytest.approx(0.25)
    assert first["tested_per_position"] == [0, 0]  # stats without the per-position tests
    tested = scraped(monkeypatch, 2, SpeculativeStats(10, 19, 9, [4, 3, 3], 14, [10, 5]))
    assert acceptance_delta(middle, tested)["tested_per_position"] == [10, 5]
    second = acceptance_delta(middle, after)
    assert second["accepted_lengths"] == [2, 2, 2]
    assert second["acceptance_rate"] == pytest.approx(6 / 11)
    assert second["mean_accepted_length"] == pytest.approx(1.0)
    assert second["draft_share"] == pytest.approx(6 / 8)  # 6 verify slots, 2 undrafted


def test_the_workloads_are_real_text_and_the_same_every_time() -> None:
    n = len(COPY_FUNCTIONS) + 2
    copies = copy_prompts(n)
    assert copies == copy_prompts(n) and len(copies) == n
    assert "def dedent(text" in copies[0].text and "`text` to `text_arg`" in copies[0].text
    assert "# Reviewed." in copies[-1].text  # past the list: the other edit
    assert len({p.text for p in copies}) == n
    chats = chat_prompts(3)
    assert chats == chat_prompts(3) and [p.text for p in chats] == list(CHAT_PROMPTS[:3])
    assert all(p.text for p in copies + chats)


def test_a_closed_loop_sends_each_request_when_a_client_frees() -> None:
    # two clients: request 2 follows the first to finish (1 at 3.0), request 3 the next (0 at 5.0)
    sent, finished = [0.0, 0.1, 3.2, 5.05], [5.0, 3.0, 9.0, 8.0]
    gaps = think_gaps(sent, finished, 2)
    assert gaps == pytest.approx([0.0, 0.1, 0.2, 0.05])
    assert closed_loop_arrivals(finished, gaps, 2) == pytest.approx(sent)
    # one client: each request follows the one before it, whenever that one finishes
    assert closed_loop_arrivals([2.0, 3.0, 7.0], [0.0, 0.1, 0.1], 1) == pytest.approx(
        [0.0, 2.1, 3.1]
    )


def request(sent: float, finished: float, tokens: int) -> dict[str, Any]:
    e2e = finished - sent
    return {
        "sent": sent, "finished": finished, "output_tokens": tokens, "ttft_ms": 100.0,
        "tpot_ms": 10.0, "e2e_ms": e2e * 1e3, "tokens_per_s": tokens / e2e,
    }  # fmt: skip


def test_speedup_and_errors() -> None:
    plain = throughput([request(0.0, 2.0, 20), request(2.0, 4.0, 20)])
    spec = throughput([request(0.0, 1.0, 20), request(1.0, 2.5, 20)])
    assert plain["tokens_per_s"] == pytest.approx(10.0)
    assert spec["tokens_per_s"] == pytest.approx(16.0)
    assert speedup(spec, plain) == pytest.approx(1.6)
    assert relative_error(1.76, 1.6) == pytest.approx(0.1)
    assert relative_error(1.0, 0.0) != relative_error(1.0, 0.0)  # nan: nothing to compare with


def test_seeds_average_the_figures_and_keep_the_first_run() -> None:
    plain = {"tokens_per_s": 10.0}
    runs: list[dict[str, Any]] = [
        {"tokens_per_s": t, "requests": [t], "spec": {"acceptance_rate": a, "draft_share": d,
                                                      "accepted_lengths": [t]}}
        for t, a, d in ((12.0, 0.4, 0.3), (16.0, 0.6, 0.5))
    ]  # fmt: skip
    out = seed_means(runs, [7, 8], plain)
    assert out["speedup"] == pytest.approx(1.4) and out["tokens_per_s"] == pytest.approx(14.0)
    assert out["spec"]["acceptance_rate"] == pytest.approx(0.5)
    assert out["spec"]["draft_share"] == pytest.approx(0.4)
    assert out["requests"] == [12.0] and out["spec"]["accepted_lengths"] == [12.0]
    assert [s["seed"] for s in out["seeds"]] == [7, 8]
    assert [s["speedup"] for s in out["seeds"]] == pytest.approx([1.2, 1.6])
    assert runs[0]["spec"]["acceptance_rate"] == 0.4  # the runs are left as they were


def test_the_draft_share_is_of_every_decode_slot() -> None:
    counts = {"verify_slots": 10, "undrafted_slots": 30, "draft_tokens": 40, "accepted_tokens": 8}
    figures = acceptance_figures(counts)
    assert figures["draft_share"] == pytest.approx(0.25)
    assert figures["acceptance_rate"] == pytest.approx(0.2)
    assert figures["mean_accepted_length"] == pytest.approx(0.8)
    none = acceptance_figures(counts | {"verify_slots": 0, "undrafted_slots": 0})
    assert none["draft_share"] != none["draft_share"]  # nan: no decode slot


def test_differences_name_the_first_token_that_differs() -> None:
    plain = [{"tokens": ["a", "b", "c"]}, {"tokens": ["a", "b"]}, {"tokens": ["x"]}]
    spec = [{"tokens": ["a", "b", "c"]}, {"tokens": ["a", "b", "d"]}, {"tokens": ["y"]}]
    assert differences(plain, spec) == [
        {"request": 1, "first_difference": 2},
        {"request": 2, "first_difference": 0},
    ]


def case(c: int, plain: float, spec: float, workload: str = "chat", k: int = 4) -> dict[str, Any]:
    return {
        "workload": workload, "concurrency": c, "num_draft_tokens": k,
        "real": {"speedup": spec / plain},
    }  # fmt: skip


def test_the_crossover_is_the_smallest_concurrency_where_speculation_is_slower() -> None:
    cases = [case(16, 100, 90), case(1, 10, 15), case(4, 40, 38), case(8, 70, 75)]
    cases += [case(1, 10, 12, k=2), case(4, 40, 44, k=2)]
    rows = crossovers(cases)
    found = [(r["num_draft_tokens"], r["crossover_concurrency"]) for r in rows]
    assert found == [(4, 4), (2, None)]
    assert list(rows[0]["speedup_by_concurrency"]) == [1, 4, 8, 16]
    assert rows[0]["speedup_by_concurrency"][1] == pytest.approx(1.5)


def test_synthetic_servers_get_their_flags_and_skip_the_output_check() -> None:
    args = Namespace(method="synthetic", acceptance_rate="0.9,0.5", ngram_max=3, ngram_min=1)
    assert speculative_args(args, 2) == (
        "--speculative", "synthetic", "--num-draft-tokens", "2", "--acceptance-rate", "0.9,0.5",
    )  # fmt: skip
    ngram = Namespace(method="ngram", acceptance_rate=None, ngram_max=3, ngram_min=2)
    assert speculative_args(ngram, 4)[-4:] == ("--ngram-max", "3", "--ngram-min", "2")
    plain = throughput([request(0.0, 2.0, 20)]) | {"requests": [{"tokens": ["a"]}]}
    spec = throughput([request(0.0, 1.0, 20)]) | {"requests": [{"tokens": ["b"]}]}
    out = one_case(args, None, None, plain, spec, "chat", 4, 2)
    assert out["real"]["differences"] is None
    assert out["real"]["output_check"] == SYNTHETIC_OUTPUT
    assert out["real"]["speedup"] == pytest.approx(2.0) and "sim" not in out
    assert one_case(ngram, None, None, plain, spec, "chat", 4, 2)["real"]["differences"] == [
        {"request": 0, "first_difference": 0}
    ]


def test_recorded_steps_are_priced_per_kind() -> None:
    """Decodes, verify steps, a chunk beside verify spans and a plain prefill, each recorded
    slower or faster than the model by a known factor: the error per kind is that factor's
    inverse; a record with device times is set against the model's device times."""
    model = TableCostModel(read_profile(ROOT / "reports/speculative/profile_crossover_cpu.csv"))
    points = {
        "decode": (StepPoint((), (100,) * 4), 1.0),
        "verify": (StepPoint((), (100,) * 4, draft=4), 1.25),
        "chunk beside verify": (StepPoint(((0, 40),), (100,) * 4, draft=4), 0.8),
        "prefill or mixed": (StepPoint(((0, 64),), ()), 2.0),
    }
    rows = []
    for point, factor in points.values():
        shape = StepShape.of_plan(point.plan(16))
        rows.append({**{c: getattr(shape, c) for c in SHAPE_COLUMNS}, "enqueued": 10.0,
                     "launched": 10.0 + factor * model.step_time(shape), "device_ms": float("nan"),
                     "draft_tokens": 16 if point.draft else 0})  # fmt: skip
    record = pd.DataFrame(rows)
    priced = priced_steps(record, model)
    assert list(priced) == list(points)
    for kind, (_, factor) in points.items():
        assert priced[kind]["steps"] == 1
        assert priced[kind]["error"] == pytest.approx(1 / factor - 1)
    # a plain server's record (no draft column) has no verify kinds
    assert list(priced_steps(record.drop(columns="draft_tokens"), model)) == [
        "decode",
        "prefill or mixed",
    ]
    shapes = [StepShape(*(int(record.loc[i, c]) for c in SHAPE_COLUMNS)) for i in range(4)]
    on_device = record.assign(device_ms=[2e3 * model.device_time(s) for s in shapes])
    assert all(
        row["error"] == pytest.approx(-0.5) for row in priced_steps(on_device, model).values()
    )
