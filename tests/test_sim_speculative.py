"""The simulator's speculative decoding: the acceptance model, its draws and what informs it,
the sweep's grid and the profile's verify plans (replays: test_sim_speculative_replay.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from core.scheduler import PLACEHOLDER_TOKEN, DecodeSlot, Plan
from core.scheduler.shape import StepShape
from engine.ipc.messages import SpeculativeStats
from engine.server.speculative_metrics import SpeculativeCollector
from lab.profile.grid import GridSpec, StepPoint
from lab.sweep.grid import check_grid
from lab.sweep.sweep import plan_grid
from sim.costs.acceptance import AcceptanceDraws, AcceptanceModel
from sim.costs.acceptance_files import load_acceptance

PROFILE = "profiles/cpu-xeon-2core_smollm2-135m.csv"


def slots_plan(n: int, k: int, seed: int = 0) -> Plan:
    """``n`` draft slots of ``k`` drafts, of requests and positions drawn at random."""
    rng = np.random.default_rng(seed)
    draft = (PLACEHOLDER_TOKEN,) * k
    decode = tuple(
        DecodeSlot(f"r{rng.integers(1 << 40)}", int(rng.integers(1, 10_000)), (), draft)
        for _ in range(n)
    )
    return Plan(step=1, decode=decode)


def survival(counts: list[int]) -> np.ndarray:
    """P(accepted >= i) for i = 1 .., from counts of accepted lengths."""
    c = np.asarray(counts, dtype=np.float64)
    return np.cumsum(c[::-1])[::-1][1:] / c.sum()


# ---------------------------------------------------------------- the model and its draws
def test_draws_follow_the_per_position_rates() -> None:
    rates = (0.9, 0.7, 0.5, 0.3)
    draws = AcceptanceDraws(AcceptanceModel.of_rates(rates), seed=7)
    got = draws.draw(slots_plan(20_000, 4))
    assert got is not None and len(got) == 20_000
    assert set(got.values()) <= set(range(5))
    want = np.cumprod(rates)  # P(n >= i) = a_1 .. a_i
    assert np.abs(survival(draws.accepted_lengths) - want).max() < 0.02
    assert draws.verify_slots == 20_000 and draws.draft_tokens == 80_000
    assert draws.accepted_tokens == sum(got.values())
    # a slot with fewer drafts accepts at most those, at the first rates
    short = AcceptanceDraws(AcceptanceModel.of_rates(rates), seed=7)
    two = short.draw(slots_plan(20_000, 2, seed=1))
    assert two is not None and max(two.values()) == 2
    assert np.abs(survival(short.accepted_lengths) - want[:2]).max() < 0.02


def test_a_single_rate_is_geometric_at_any_length() -> None:
    model = AcceptanceModel.of_rate(0.6)
    model.check_covers(64)
    draws = AcceptanceDraws(model, seed=3)
    draws.draw(slots_plan(20_000, 6))
    assert np.abs(survival(draws.accepted_lengths) - 0.6 ** np.arange(1, 7)).max() < 0.02


def test_draws_are_deterministic_and_keyed_by_request_and_position() -> None:
    model = AcceptanceModel.of_rates((0.8, 0.5, 0.2))
    plan = slots_plan(500, 3)
    a = AcceptanceDraws(model, seed=1).draw(plan)
    assert a == AcceptanceDraws(model, seed=1).draw(plan)
    shuffled = replace(plan, decode=plan.decode[::-1])  # batch order does not matter
    assert a == AcceptanceDraws(model, seed=1).draw(shuffled)
    assert a != AcceptanceDraws(model, seed=2).draw(plan)
    assert AcceptanceDraws(model).draw(Plan(step=1, decode=(DecodeSlot("x", 3, ()),))) is None


def test_rates_of_a_histogram_recover_known_rates() -> None:
    rates = np.array([0.85, 0.6, 0.45, 0.2])
    reach = np.concatenate(([1.0], np.cumprod(rates)))  # P(n >= i), i = 0 .. 4
    pmf = reach - np.append(reach[1:], 0.0)
    counts = [round(p * 1e7) for p in pmf]
    model = AcceptanceModel.of_histogram(counts)
    assert np.allclose(model.rates, rates, atol=1e-5)
    # and from the histogram of the model's own draws
    draws = AcceptanceDraws(AcceptanceModel.of_rates(tuple(rates)), seed=11)
    draws.draw(slots_plan(40_000, 4))
    assert (
        np.abs(np.array(AcceptanceModel.of_histogram(draws.accepted_lengths).rates) - rates).max()
        < 0.03
    )
    # a position no slot reached gets rate 0
    assert AcceptanceModel.of_histogram([5, 5, 0, 0]).rates == (0.5, 0.0, 0.0)


def test_rates_of_mixed_length_drafts_come_back_with_the_tested_positions() -> None:
    """Slots of 1-4 drafts drawn at known rates: the tallies' per-position tests give the
    rates back; the histogram alone gives the later ones low."""
    rates = (0.8, 0.7, 0.6, 0.5)
    draws = AcceptanceDraws(AcceptanceModel.of_rates(rates), seed=5)
    for k in (1, 2, 3, 4):
        draws.draw(slots_plan(20_000, k, seed=k))
    hist, tested = draws.accepted_lengths, draws.tested_per_position
    assert draws.describe()["tested_per_position"] == tested
    assert tested[0] == draws.verify_slots == 80_000  # every slot tests its first token
    got = AcceptanceModel.of_histogram(hist, tested=tested).rates
    assert np.abs(np.array(got) - rates).max() < 0.02
    low = AcceptanceModel.of_histogram(hist).rates
    assert all(lo < a - 0.1 for lo, a in zip(low[1:], rates[1:], strict=True))


def test_empirical_draws_follow_the_histogram() -> None:
    counts = [30, 10, 20, 40]  # K = 3
    model = AcceptanceModel.of_histogram(counts, empirical=True)
    draws = AcceptanceDraws(model, seed=5)
    draws.draw(slots_plan(20_000, 3))
    got = np.array(draws.accepted_lengths) / 20_000
    assert np.abs(got - np.array(counts) / 100).max() < 0.02
    # two drafts: the mass past 2 lumps at 2
    short = AcceptanceDraws(model, seed=5)
    short.draw(slots_plan(20_000, 2, seed=2))
    assert np.abs(np.array(short.accepted_lengths) / 20_000 - [0.3, 0.1, 0.6]).max() < 0.02


@pytest.mark.parametrize(
    ("spec", "k", "message"),
    [
        ("1.2", 2, "must be in [0, 1]"),
        ("0.5,-0.1", 2, "must be in [0, 1]"),
        ("nan", 1, "must be in [0, 1]"),
        ("0.9,0.8", 4, "covers 2 draft positions"),
        ("fast", 2, "neither comma-separated rates"),
        ("", 2, "no rate given"),
    ],
)
def test_bad_acceptance_is_a_clear_error(spec: str, k: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_acceptance(spec, k)


def test_histogram_inputs_are_checked() -> None:
    with pytest.raises(ValueError, match="counts no verify slot"):
        AcceptanceModel.of_histogram([0, 0, 0])
    with pytest.raises(ValueError, match="integer >= 0"):
        AcceptanceModel.of_histogram([3, -1])
    with pytest.raises(ValueError, match="empirical draws need"):
        load_acceptance("0.5", 1, empirical=True)


# ---------------------------------------------------------------- what the engine measured
def metrics_page(
    accepted_lengths: list[int],
    k: int,
    replicas: int = 2,
    undrafted: int = 0,
    tested: list[int] | None = None,
) -> str:
    """The engine's ``/metrics`` text of its speculative collector, over ``replicas``;
    ``tested`` per position, by default as if every draft were ``k`` long."""
    registry = CollectorRegistry()
    collector = SpeculativeCollector("m", k)
    at_least = np.cumsum(accepted_lengths[::-1])[::-1].tolist()
    tested = at_least[:k] if tested is None else tested
    for replica in range(replicas):
        slots = sum(accepted_lengths)
        stats = SpeculativeStats(
            slots, k * slots, 0, list(accepted_lengths), undrafted, list(tested)
        )
        collector.update(replica, stats)
    registry.register(collector)
    return generate_latest(registry).decode()


def test_the_engines_metrics_page_informs_the_model(tmp_path: Path) -> None:
    path = tmp_path / "metrics.txt"
    path.write_text(metrics_page([50, 30, 15, 5], k=4))  # no slot accepted all 4
    model = load_acceptance(str(path), 4)
    assert model.histogram == (100, 60, 30, 10, 0)  # two replicas summed, K from the buckets
    assert model.rates == pytest.approx((0.5, 0.4, 0.25, 0.0))
    assert load_acceptance(str(path), 3, empirical=True).empirical
    with pytest.raises(ValueError, match="covers 4"):
        load_acceptance(str(path), 5)
    empty = tmp_path / "plain.txt"
    empty.write_text("# HELP other\nother_total 3\n")
    with pytest.raises(ValueError, match="no engine_spec_decode_accepted_length"):
        load_acceptance(str(empty), 2)


def test_per_position_tests_take_short_drafts_out_of_the_rates(tmp_path: Path) -> None:
    """Drafts cut short accept whole without testing the positions past them: the rates come
    from the positions tested, and a page without the counter reads such a slot's end as a
    rejection (the rates low)."""
    # per replica, 40 slots of 4 drafts accepting 0-4: 10, 16, 6, 0, 8; 20 of one draft,
    # accepted; 10 of two drafts, the first rejected
    hist = [10 + 10, 16 + 20, 6, 0, 8]
    tested = [70, 16 + 6 + 8, 6 + 8, 8]  # positions 0..3: the 4-draft slots that got there
    path = tmp_path / "metrics.txt"
    path.write_text(metrics_page(hist, k=4, tested=tested))
    model = load_acceptance(str(path), 4)
    assert model.tested == tuple(2 * t for t in tested)
    want = [50 / 70, 14 / 30, 8 / 14, 1.0]
    assert model.rates == pytest.approx(want)
    older = tmp_path / "older.txt"
    older.write_text("".join(line + "\n" for line in path.read_text().splitlines()
                             if "tested" not in line))  # fmt: skip
    low = load_acceptance(str(older), 4)
    assert low.tested == ()
    assert low.rates == pytest.approx([50 / 70, 14 / 50, 8 / 14, 1.0])  # 20 short, read low
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"accepted_lengths": hist, "tested_per_position": tested}))
    assert load_acceptance(str(stats), 4).rates == pytest.approx(want)
    stats.write_text(json.dumps({"accepted_lengths": hist, "tested_per_position": [70, 5]}))
    with pytest.raises(ValueError, match="do not fit the accepted lengths"):
        load_acceptance(str(stats), 4)  # 14 slots passed position 1, only 5 tested there


def test_the_draft_share_is_read_where_the_rates_are(tmp_path: Path) -> None:
    page = tmp_path / "metrics.txt"
    page.write_text(metrics_page([50, 30, 15, 5], k=4, undrafted=300))
    model = load_acceptance(str(page), 4)
    assert model.draft_share == pytest.approx(0.25)  # 200 drafted, 600 undrafted slots
    assert model.describe()["draft_share"] == pytest.approx(0.25)
    assert load_acceptance(str(page), 4, draft_share=0.6).draft_share == 0.6  # --draft-share
    older = tmp_path / "older.txt"  # an engine without the undrafted counter: every slot
    older.write_text("".join(line + "\n" for line in page.read_text().splitlines()
                             if "undrafted" not in line))  # fmt: skip
    assert load_acceptance(str(older), 4).draft_share == 1.0
    assert load_acceptance("0.5", 4).draft_share == 1.0
    given = tmp_path / "share.json"
    given.write_text(json.dumps({"rates": [0.9, 0.5], "draft_share": 0.3}))
    assert load_acceptance(str(given), 2).draft_share == 0.3
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"accepted_lengths": [2, 2], "undrafted_slots": 12}))
    assert load_acceptance(str(stats), 1).draft_share == pytest.approx(0.25)
    with pytest.raises(ValueError, match="draft share must be in"):
        load_acceptance("0.5", 4, draft_share=1.5)


def test_json_rates_or_accepted_lengths(tmp_path: Path) -> None:
    rates = tmp_path / "rates.json"
    rates.write_text(json.dumps({"rates": [0.9, 0.5]}))
    assert load_acceptance(str(rates), 2).rates == (0.9, 0.5)
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps({"accepted_lengths": [2, 2], "num_draft_tokens": 3}))
    assert load_acceptance(str(stats), 3).rates == (0.5, 0.0, 0.0)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([1, 2]))
    with pytest.raises(ValueError, match="'rates' or 'accepted_lengths'"):
        load_acceptance(str(bad), 1)


# ---------------------------------------------------------------- sweeps and profiles
def test_the_grid_sweeps_num_draft_tokens(tmp_path: Path) -> None:
    grid = check_grid({"speculative": "ngram", "acceptance": "0.7", "num_draft_tokens": [1, 2, 4]})
    plan = plan_grid(grid, Path("traces/azure_code.csv"), 10, None, {})
    assert [p.error for p in plan.probes] == ["", "", ""]
    assert [p.config["num_draft_tokens"] for p in plan.probes] == [1, 2, 4]
    assert len({p.key for p in plan.probes}) == 3
    bad = plan_grid(check_grid({"speculative": "ngram", "acceptance": "0.7,0.5",
                                "num_draft_tokens": [2, 3]}),
                    Path("traces/azure_code.csv"), 10, None, {})  # fmt: skip
    assert bad.probes[0].error == "" and "covers 2" in bad.probes[1].error


def test_the_profile_grid_builds_verify_plans() -> None:
    spec = replace(GridSpec.default("cpu"), decode_batches=(1, 4), decode_contexts=(100, 300),
                   verify_drafts=(2, 3), holdout=8)  # fmt: skip
    verify = [p for p in spec.points() if p.draft and not p.prefill]
    assert {(p.draft, len(p.decode), p.decode[0]) for p in verify if p.split == "fit"} == {
        (k, b, c) for k in (2, 3) for b in (1, 4) for c in (100, 300)
    }
    assert any(p.split == "holdout" for p in verify)
    # a newcomer's chunk beside verify spans: each mixed point once more per K
    mixed = {(p.draft, p.decode) for p in spec.points() if p.prefill and p.decode}
    fit_mixed = {(p.draft, p.decode) for p in spec.points() if p.prefill and p.decode
                 and p.split == "fit" and p.decode[0] == p.decode[-1]}  # fmt: skip
    assert fit_mixed == {(k, (512,) * b) for k in (0, 2, 3) for b in (4, 16)}
    assert {k for k, _ in mixed} == {0, 2, 3}
    point = StepPoint((), (100, 300), draft=3)
    assert point.sequence_pages(16) == [7, 19]  # 104 and 304 positions
    plan = point.plan(16)
    assert [len(d.draft) for d in plan.decode] == [3, 3] and plan.num_draft_tokens == 6
    assert [len(d.pages) for d in plan.decode] == [7, 19]
    # no verify drafts: the grid and its held-out draws are as before
    plain = GridSpec.default("cpu")
    assert not any(p.draft for p in plain.points())
    with pytest.raises(ValueError, match="verify drafts must be >= 1"):
        replace(plain, verify_drafts=(0,))


def test_a_verify_plan_has_the_shape_of_its_extends() -> None:
    plan = StepPoint((), (100, 300), draft=3).plan(16)
    shape = StepShape.of_plan(plan)
    assert shape.prefill_tokens == 8 and shape.decode_requests == 0 and shape.sampled == 8
    assert shape.context_tokens == 104 + 304
    assert shape.prefill_attention == 4 * 100 + 10 + 4 * 300 + 10
