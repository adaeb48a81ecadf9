"""The ``table`` cost model's fit: step shapes, extrapolation, held-out error, decode runs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.scheduler.shape import StepShape
from lab.profile.grid import StepPoint, cuda_batches
from sim.costs import TableCostModel
from sim.costs.fit import PiecewiseFit, nonnegative_tail_lstsq, relative_errors
from sim.costs.profile import Profile, ProfileRow


def bucketed(batch: int, context: int) -> float:
    """A CUDA-graph-like decode time: padded to the next multiple of 8, plus KV reads."""
    padded = batch if batch <= 8 else 8 * math.ceil(batch / 8)
    return 2e-3 + 5e-5 * padded + 1e-9 * context


def prefill_time(shape: StepShape) -> float:
    return 3e-3 + 2e-5 * shape.prefill_tokens + 4e-11 * shape.prefill_attention


def row(shape: StepShape, t: float, split: str = "fit") -> ProfileRow:
    return ProfileRow(ProfileRow.step_kind(shape), shape, 1, t, t, t, 3, split)


def shape_of(point: StepPoint) -> StepShape:
    return StepShape.of_plan(point.plan(16))


def decode_profile(batches: tuple[int, ...], holdout: list[tuple[int, int]]) -> Profile:
    rows = []
    for b in batches:
        for ctx in (256, 4096):
            rows.append(row(shape_of(StepPoint((), (ctx,) * b)), bucketed(b, b * (ctx + 1))))
    for b, ctx in holdout:
        shape = shape_of(StepPoint((), (ctx,) * b))
        rows.append(row(shape, bucketed(b, b * (ctx + 1)), "holdout"))
    return Profile("synthetic.csv", {"hardware": "synthetic"}, rows)


def test_decode_fit_follows_cuda_graph_buckets() -> None:
    rng = np.random.default_rng(0)
    holdout = [(int(rng.integers(1, 129)), int(rng.integers(256, 4097))) for _ in range(40)]
    table = TableCostModel(decode_profile(cuda_batches(128), holdout))
    assert table.errors["holdout"]["rows"] == 40
    assert table.errors["holdout"]["max"] < 1e-6
    # a step between bucket edges costs the bucket's time, not a linear blend
    assert table.step_time(shape_of(StepPoint((), (1000,) * 17))) == pytest.approx(
        bucketed(17, 17 * 1001), rel=1e-6
    )
    # with only the bucket sizes measured, the steps blur: the held-out error shows it
    coarse = TableCostModel(decode_profile((1, 8, 32, 64, 128), holdout))
    assert coarse.errors["holdout"]["max"] > 0.05


def test_prefill_fit_separates_tokens_from_attention() -> None:
    rows = []
    for tokens in (16, 64, 256, 1024, 4096):
        for chunks in (1, 4):
            for prefix in (0, 2048):
                shape = shape_of(StepPoint(((prefix, tokens // chunks),) * chunks, ()))
                rows.append(row(shape, prefill_time(shape)))
    table = TableCostModel(Profile("p.csv", {}, rows))
    long_prefix = shape_of(StepPoint(((6000, 3000),), ()))
    assert table.step_time(long_prefix) == pytest.approx(prefill_time(long_prefix), rel=1e-6)
    # beyond the largest measured step the last segment's slope continues
    big = shape_of(StepPoint(((0, 8192),), ()))
    assert table.step_time(big) == pytest.approx(prefill_time(big), rel=1e-6)
    # a profile without decode rows prices decode steps with the prefill fit
    assert table.step_time(StepShape.decode(4, 400, 100)) > 0


def test_holdout_rows_stay_out_of_the_fit() -> None:
    good = decode_profile((1, 2, 4, 8, 16), [])
    wild = row(shape_of(StepPoint((), (300,) * 3)), 1.0, "holdout")
    table = TableCostModel(Profile("p.csv", {}, [*good.steps, wild]))
    assert table.step_time(wild.shape) == pytest.approx(bucketed(3, 3 * 301), rel=1e-6)
    assert table.errors["holdout"]["max"] > 0.9
    assert "holdout error over 1 rows" in table.provenance


def test_times_below_the_grid_are_floored() -> None:
    table = TableCostModel(decode_profile((4, 8, 16), []))
    fastest = min(r.duration_s for r in decode_profile((4, 8, 16), []).steps)
    assert table.step_time(StepShape.decode(1, 10, 10)) >= fastest


def test_relative_errors_arithmetic() -> None:
    e = relative_errors(np.array([1.1, 0.9, 2.0, 1.0]), np.array([1.0, 1.0, 1.0, 1.0]))
    assert e["rows"] == 4
    assert e["mean"] == pytest.approx((0.1 + 0.1 + 1.0 + 0.0) / 4)
    assert e["max"] == pytest.approx(1.0)
    assert math.isnan(relative_errors(np.array([]), np.array([]))["mean"])


def test_piecewise_fit_interpolates_its_knots_exactly() -> None:
    x = np.array([1.0, 2.0, 5.0, 9.0])
    y = np.array([1.0, 3.0, 2.0, 6.0])
    fit = PiecewiseFit.fit(x, np.zeros((4, 0)), y)
    np.testing.assert_allclose(fit.predict(x, np.zeros((4, 0))), y, rtol=1e-9)
    assert fit.predict_one(3.5, ()) == pytest.approx(2.5)
    assert fit.predict_one(0.0, ()) == pytest.approx(1.0)  # flat below the grid
    assert fit.predict_one(13.0, ()) == pytest.approx(10.0)  # last slope above it
    with pytest.raises(ValueError, match="must be > 0"):
        PiecewiseFit.fit(x, np.zeros((4, 0)), np.array([1.0, 0.0, 1.0, 1.0]))


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(4, 16),
    free=st.integers(1, 4),
    bounded=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
)
def test_nonnegative_tail_lstsq_is_the_bounded_optimum(
    rows: int, free: int, bounded: int, seed: int
) -> None:
    """The KKT conditions of ``min |A c - 1|^2`` with the last ``bounded`` of ``c`` >= 0."""
    design = np.random.default_rng(seed).normal(size=(rows, free + bounded))
    coef = nonnegative_tail_lstsq(design, bounded)
    grad = design.T @ (design @ coef - 1.0)
    tol = 1e-7 * max(1.0, float(np.abs(design).sum()))
    assert np.all(coef[free:] >= 0)
    np.testing.assert_allclose(grad[:free], 0, atol=tol)
    for c, g in zip(coef[free:], grad[free:], strict=True):
        assert (abs(g) <= tol) if c > 0 else (g >= -tol)


def test_prefill_fit_prices_a_step_of_many_prompts_by_its_tokens_and_prompts() -> None:
    """One-sequence prefills cannot tell query-key pairs from tokens; a dearer two-prompt row
    once pulled the pairs' coefficient below zero, and four prompts off the grid paid twice
    (33 % over the tokens' price). What the second prompt cost is now the sampled rows'
    term: four prompts pay their tokens and three times that."""
    prefills = [shape_of(StepPoint(((0, n),), ())) for n in (32, 128, 512, 1024)]
    rows = [row(s, 0.1 + 2e-3 * s.prefill_tokens) for s in prefills]
    two = shape_of(StepPoint(((0, 256), (0, 256)), ()))
    rows.append(row(two, 1.1 * (0.1 + 2e-3 * 512)))
    table = TableCostModel(Profile("prefill.csv", {}, rows))
    assert all(c >= 0 for c in table.wall.prefill.fit.coef[-2:])
    assert table.wall.prefill.group.extras == ("prefill_attention", "extend_sampled")
    four = shape_of(StepPoint(((0, 468), (0, 536), (0, 250), (0, 304)), ()))
    second = 0.1 * (0.1 + 2e-3 * 512)
    assert table.step_time(four) == pytest.approx(0.1 + 2e-3 * 1558 + 3 * second, rel=0.01)


def padded_time(shape: StepShape) -> float:
    """A decode kernel that pads its batch to the longest request (the torch backend)."""
    return 1e-3 + 2e-4 * shape.decode_requests + 3e-8 * shape.decode_padded


def test_decode_fit_tells_padding_from_context() -> None:
    grid = [StepPoint((), ctx) for b in (1, 4, 16) for ctx in ((100,) * b, (3000,) * b)]
    grid += [StepPoint((), (3000,) + (100,) * (b - 1)) for b in (4, 16)]
    padded = [row(shape_of(p), padded_time(shape_of(p))) for p in grid]
    paged = [row(shape_of(p), bucketed(len(p.decode), shape_of(p).decode_context)) for p in grid]
    ragged = shape_of(StepPoint((), (2500, 40, 90, 700, 1200, 60, 300, 10)))
    table = TableCostModel(Profile("torch.csv", {}, padded))
    assert table.step_time(ragged) == pytest.approx(padded_time(ragged), rel=1e-6)
    table = TableCostModel(Profile("paged.csv", {}, paged))
    assert table.step_time(ragged) == pytest.approx(bucketed(8, ragged.decode_context), rel=1e-6)


@settings(max_examples=30, deadline=None)
@given(
    batches=st.lists(st.integers(2, 300), min_size=1, max_size=8, unique=True),
    noise=st.lists(st.floats(0.5, 2.0), min_size=24, max_size=24),
    batch=st.integers(1, 400),
    context=st.integers(1, 2000),
    extra=st.integers(0, 5000),
    k=st.integers(1, 50),
)
def test_decode_runs_equal_single_steps(
    batches: list[int], noise: list[float], batch: int, context: int, extra: int, k: int
) -> None:
    rows = []
    for i, b in enumerate(sorted(batches)):
        for j, ctx in enumerate(((100,) * b, (3000,) * b, (3000,) + (100,) * (b - 1))):
            shape = shape_of(StepPoint((), ctx))
            rows.append(row(shape, padded_time(shape) * noise[3 * i + j]))
    table = TableCostModel(Profile("p.csv", {}, rows))
    longest = context + extra
    total = context * batch + extra
    run = table.decode_times(batch, total, longest, k)
    single = [
        table.step_time(StepShape.decode(batch, total + i * batch, longest + i)) for i in range(k)
    ]
    np.testing.assert_allclose(run, single, rtol=1e-9)
    assert np.all(run > 0)


def test_device_times_get_their_own_fit() -> None:
    """Device time = the step's period back to back; the wall time adds the host's work."""
    rows = []
    for b in (1, 2, 4, 8, 16, 32):
        for ctx in (256, 4096):
            shape = shape_of(StepPoint((), (ctx,) * b))
            device = bucketed(b, shape.decode_context)
            host = 1.5e-3 + 2e-5 * b
            rows.append(
                ProfileRow("decode", shape, 1, device + host, device, device, 3, "fit", device)
            )
    table = TableCostModel(Profile("p.csv", {}, rows))
    shape = shape_of(StepPoint((), (1000,) * 16))
    assert table.device_time(shape) == pytest.approx(bucketed(16, shape.decode_context), rel=1e-6)
    assert table.step_time(shape) == pytest.approx(
        bucketed(16, shape.decode_context) + 1.5e-3 + 2e-5 * 16, rel=1e-6
    )
    run = table.decode_device_times(16, shape.decode_context, 1001, 5)
    single = [
        table.device_time(StepShape.decode(16, shape.decode_context + 16 * i, 1001 + i))
        for i in range(5)
    ]
    np.testing.assert_allclose(run, single, rtol=1e-9)
    assert "device_decode" in table.describe()["fit"]  # type: ignore[operator]
    # without separate device times, one fit serves both
    same = TableCostModel(decode_profile((1, 8, 16), []))
    assert same.device is same.wall and "device holdout" not in same.errors


def verify_time(shape: StepShape) -> float:
    """A torch-backend-like verify step: each slot's short extend costs about a prefill's."""
    return 4e-2 + 1e-2 * shape.prefill_tokens + 1e-10 * shape.prefill_attention


def test_verify_steps_have_their_own_fit_where_the_profile_measured_them() -> None:
    rows = [row(shape_of(StepPoint((), (ctx,) * b)), bucketed(b, b * ctx)) for b in (1, 8)
            for ctx in (64, 1024)]  # fmt: skip
    prefills = [shape_of(StepPoint(((0, n),), ())) for n in (32, 128, 512)]
    rows += [row(s, prefill_time(s)) for s in prefills]
    plain = TableCostModel(Profile("no-verify.csv", {"hardware": "synthetic"}, rows))
    verifies = [
        shape_of(StepPoint((), (ctx,) * b, draft=4)) for b in (1, 4, 8) for ctx in (64, 1024)
    ]
    rows += [row(s, verify_time(s)) for s in verifies]
    table = TableCostModel(Profile("verify.csv", {"hardware": "synthetic"}, rows))
    for s in verifies:  # at the knots, exact; every row of a verify step is sampled
        assert s.sampled == s.prefill_tokens
        assert table.step_time(s) == pytest.approx(verify_time(s), rel=1e-6)
    between = shape_of(StepPoint((), (300,) * 2, draft=4))
    assert table.step_time(between) == pytest.approx(verify_time(between), rel=0.05)
    # a one-chunk prefill of as many tokens as 8 slots' spans is priced as a prefill
    chunk = shape_of(StepPoint(((0, 40),), ()))
    assert table.step_time(chunk) == pytest.approx(prefill_time(chunk), rel=0.1)
    assert table.step_time(chunk) < 0.05 * table.step_time(verifies[-1])
    # without verify rows the prefill fit prices verify steps, as before
    assert plain.step_time(verifies[0]) == pytest.approx(table.wall.prefill.time(verifies[0]))
    assert "verify" in table.describe()["fit"]  # type: ignore[operator]


def extend_time(shape: StepShape) -> float:
    """A torch-backend-like step with prefill: every sampled extend row (a chunk's last, each
    row of a verify span) costs as much as 100 prefill tokens."""
    tokens = shape.prefill_tokens + shape.decode_requests
    return prefill_time(shape) + 2e-5 * tokens + 2e-3 * shape.extend_sampled


def test_a_chunk_beside_verify_spans_is_priced_from_rows_of_that_kind() -> None:
    rows = [row(s, extend_time(s)) for s in (shape_of(StepPoint(((0, n),), ()))
                                              for n in (32, 128, 512, 1024))]  # fmt: skip
    mixed = [StepPoint(((0, n),), (512,) * b) for n in (32, 128, 512) for b in (4, 16)]
    rows += [row(shape_of(p), extend_time(shape_of(p))) for p in mixed]
    plain = TableCostModel(Profile("plain.csv", {"hardware": "synthetic"}, rows))
    drafted = [StepPoint(p.prefill, p.decode, draft=4) for p in mixed]
    rows += [row(shape_of(p), extend_time(shape_of(p))) for p in drafted]
    table = TableCostModel(Profile("spec.csv", {"hardware": "synthetic"}, rows))
    newcomer = shape_of(StepPoint(((0, 64),), (300,) * 8, draft=4))  # off the grid
    assert newcomer.extend_sampled == 41 and newcomer.decode_requests == 0
    assert table.step_time(newcomer) == pytest.approx(extend_time(newcomer), rel=0.05)
    # the drafted rows prefill one sequence alone no more than mixed rows do: no knots of
    # theirs bend the prefills' spine (prefills off the grid err as much as without them)
    for n in (80, 300, 700):
        prompt = shape_of(StepPoint(((0, n),), ()))
        truth = extend_time(prompt)
        assert (
            abs(table.step_time(prompt) / truth - 1)
            < abs(plain.step_time(prompt) / truth - 1) + 0.01
        )
    # a profile whose rows all sample one extend row cannot price the term: it is left out,
    # and the newcomer's step is priced as a prefill of as many tokens
    assert "extend_sampled" in table.describe()["fit"]["prefill"]["extras"]  # type: ignore[index]
    assert "extend_sampled" not in plain.describe()["fit"]["prefill"]["extras"]  # type: ignore[index]
    assert plain.step_time(newcomer) < 0.8 * extend_time(newcomer)
