"""The detokenizer queue and token delivery: vectorized results equal a step-by-step walk."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model.delivery import TokenDelivery
from sim.model.detokenizer import serve_fifo

IPC, COST = 2e-5, 1e-5


def _one_by_one(arrive: np.ndarray, service: np.ndarray) -> tuple[np.ndarray, list[tuple]]:
    """Lindley's recursion, one message at a time; the (time, +1/-1) queue changes."""
    depart, last, changes = [], -np.inf, []
    for a, s in zip(arrive, service, strict=True):
        if last > a:
            changes += [(a, 1), (last, -1)]
        last = max(a, last) + s
        depart.append(last)
    return np.array(depart), sorted(changes, key=lambda c: (c[0], c[1]))


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 2e-3), min_size=1, max_size=60),
    tokens=st.lists(st.integers(1, 300), min_size=60, max_size=60),
)
def test_fifo_equals_one_by_one(gaps: list[float], tokens: list[int]) -> None:
    arrive = np.cumsum(gaps) + 1.0
    service = np.array(tokens[: len(arrive)]) * COST
    served = serve_fifo(arrive, service)
    depart, changes = _one_by_one(arrive, service)
    np.testing.assert_allclose(served.depart, depart, rtol=0, atol=1e-12)
    assert (served.depart >= arrive + service - 1e-12).all()
    np.testing.assert_allclose(served.queue_times, [t for t, _ in changes], atol=1e-12)
    np.testing.assert_array_equal(served.queue_lengths, np.cumsum([d for _, d in changes]))
    assert len(served.queue_lengths) == 0 or served.queue_lengths[-1] == 0


def test_busy_detokenizer_builds_a_queue() -> None:
    served = serve_fifo(np.array([0.0, 0.001, 0.002]), np.full(3, 0.01))  # 10 ms of work each
    np.testing.assert_allclose(served.depart, [0.01, 0.02, 0.03])
    np.testing.assert_allclose(served.queue_times, [0.001, 0.002, 0.01, 0.02])
    np.testing.assert_array_equal(served.queue_lengths, [1, 2, 1, 0])


@settings(max_examples=40, deadline=None)
@given(
    blocks=st.lists(
        st.tuples(st.integers(1, 6), st.sets(st.integers(0, 4), min_size=1), st.floats(1e-4, 5e-3)),
        min_size=1,
        max_size=25,
    )
)
def test_delivery_equals_a_walk_over_chunks(blocks: list[tuple[int, set[int], float]]) -> None:
    """Blocks of ``k`` steps (``k`` = 1: a single step) give one token each to a request set."""
    delivery = TokenDelivery(5, IPC, COST)
    ends, who, t = [], [], 0.0
    for k, members, step in blocks:
        block_ends = t + step * np.arange(1, k + 1)
        t = float(block_ends[-1])
        if k == 1:
            delivery.step(t, sorted(members))
        else:
            delivery.run(block_ends, sorted(members))
        ends += list(block_ends)
        who += [sorted(members)] * k
    got = delivery.deliver()

    arrive = np.array(ends) + IPC
    depart, _ = _one_by_one(arrive, np.array([len(m) for m in who]) * COST)
    client = depart + IPC
    np.testing.assert_allclose(got.client, client, rtol=0, atol=1e-12)
    chunks: dict[int, list[int]] = {i: [g for g, m in enumerate(who) if i in m] for i in range(5)}
    np.testing.assert_array_equal(got.output_tokens, [len(chunks[i]) for i in range(5)])
    detok = [sum(depart[g] - arrive[g] for g in chunks[i]) for i in range(5)]
    np.testing.assert_allclose(got.detokenize_s, detok, rtol=0, atol=1e-12)
    times = [client[chunks[i]] for i in range(5)]
    gaps = sorted(float(np.diff(t)[k]) for t in times for k in range(len(t) - 1))
    assert got.itl_s.size == len(gaps)
    pooled = np.sort(np.repeat(got.itl_s.values, got.itl_s.counts))
    np.testing.assert_allclose(pooled, gaps, rtol=0, atol=1e-12)
