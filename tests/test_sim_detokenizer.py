"""The detokenizer queue and token delivery: vectorized results equal a step-by-step walk,
and serving in chunks gives the very floats of serving at once."""

from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.model.delivery import RequestTotals, TokenDelivery
from sim.model.detokenizer import Fifo, serve_fifo

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
    fifo = Fifo()
    served = serve_fifo(arrive, service, fifo)
    queue_times, queue_lengths = fifo.queue()
    depart, changes = _one_by_one(arrive, service)
    np.testing.assert_allclose(served, depart, rtol=0, atol=1e-12)
    assert (served >= arrive + service - 1e-12).all()
    np.testing.assert_allclose(queue_times, [t for t, _ in changes], atol=1e-12)
    np.testing.assert_array_equal(queue_lengths, np.cumsum([d for _, d in changes]))
    assert len(queue_lengths) == 0 or queue_lengths[-1] == 0


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 2e-3), min_size=2, max_size=60),
    cuts=st.lists(st.integers(0, 60), max_size=5),
)
def test_fifo_in_chunks_equals_fifo_at_once(gaps: list[float], cuts: list[int]) -> None:
    arrive = np.cumsum(gaps) + 1.0
    service = np.linspace(1e-4, 3e-3, len(arrive))
    once, chunked = Fifo(), Fifo()
    whole = serve_fifo(arrive, service, once)
    bounds = [0, *sorted(c % len(arrive) for c in cuts), len(arrive)]
    parts = [serve_fifo(arrive[a:b], service[a:b], chunked) for a, b in itertools.pairwise(bounds)]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    for x, y in zip(once.queue(), chunked.queue(), strict=True):
        np.testing.assert_array_equal(x, y)


def test_busy_detokenizer_builds_a_queue() -> None:
    fifo = Fifo()
    depart = serve_fifo(np.array([0.0, 0.001, 0.002]), np.full(3, 0.01), fifo)  # 10 ms each
    queue_times, queue_lengths = fifo.queue()
    np.testing.assert_allclose(depart, [0.01, 0.02, 0.03])
    np.testing.assert_allclose(queue_times, [0.001, 0.002, 0.01, 0.02])
    np.testing.assert_array_equal(queue_lengths, [1, 2, 1, 0])


def blocks_of(step: st.SearchStrategy[float]) -> st.SearchStrategy:
    """Blocks of 1-6 steps, each giving a token to a set of the 5 requests, ``step`` apart."""
    return st.lists(
        st.tuples(st.integers(1, 6), st.sets(st.integers(0, 4), min_size=1), step),
        min_size=1,
        max_size=25,
    )


@settings(max_examples=40, deadline=None)
@given(blocks=blocks_of(st.floats(1e-4, 5e-3)))
def test_delivery_equals_a_walk_over_chunks(blocks: list[tuple[int, set[int], float]]) -> None:
    """Blocks of ``k`` steps (``k`` = 1: a single step) give one token each to a request set."""
    totals = RequestTotals(5)
    delivery = TokenDelivery(totals, IPC, COST)
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
    got = delivery.flush()

    arrive = np.array(ends) + IPC
    depart, _ = _one_by_one(arrive, np.array([len(m) for m in who]) * COST)
    client = depart + IPC
    np.testing.assert_allclose(got.client, client, rtol=0, atol=1e-12)
    chunks: dict[int, list[int]] = {i: [g for g, m in enumerate(who) if i in m] for i in range(5)}
    np.testing.assert_array_equal(totals.output_tokens, [len(chunks[i]) for i in range(5)])
    detok = [sum(depart[g] - arrive[g] for g in chunks[i]) for i in range(5)]
    np.testing.assert_allclose(totals.detokenize_s, detok, rtol=0, atol=1e-12)
    times = [client[chunks[i]] for i in range(5)]
    gaps = sorted(float(np.diff(t)[k]) for t in times for k in range(len(t) - 1))
    itl = totals.itl_s.load()
    assert itl.size == len(gaps)
    pooled = np.sort(np.repeat(itl.values, itl.counts))
    np.testing.assert_allclose(pooled, gaps, rtol=0, atol=1e-12)


def _deliver(blocks: list[tuple[int, set[int], float]], flush_after: set[int]) -> tuple:
    totals = RequestTotals(5)
    delivery = TokenDelivery(totals, IPC, COST, stream_per_token=3e-6)
    clients, t = [], 0.0
    for b, (k, members, step) in enumerate(blocks):
        block_ends = t + step * np.arange(1, k + 1)
        t = float(block_ends[-1])
        delivery.run(block_ends, sorted(members))
        if b in flush_after:
            clients.append(delivery.flush().client)
    clients.append(delivery.flush().client)
    itl = totals.itl_s.load()
    return np.concatenate(clients), totals, itl, delivery.detokenizer.queue()


@settings(max_examples=40, deadline=None)
@given(
    blocks=blocks_of(st.floats(1e-6, 5e-5)),
    flush_after=st.sets(st.integers(0, 24)),
)
def test_delivery_in_chunks_equals_delivery_at_once(
    blocks: list[tuple[int, set[int], float]], flush_after: set[int]
) -> None:
    """Flushing after any blocks gives the same floats as one flush at the end (a busy
    detokenizer and frontend: steps shorter than their service, so the queues carry over)."""
    client, totals, itl, queue = _deliver(blocks, flush_after)
    client_1, totals_1, itl_1, queue_1 = _deliver(blocks, set())
    np.testing.assert_array_equal(client, client_1)
    np.testing.assert_array_equal(totals.output_tokens, totals_1.output_tokens)
    np.testing.assert_array_equal(totals.detokenize_s, totals_1.detokenize_s)
    expanded = [np.repeat(s.values, s.counts) for s in (itl, itl_1)]
    np.testing.assert_array_equal(*expanded)  # the same gaps (equal gaps may pair up apart)
    for x, y in zip(queue, queue_1, strict=True):
        np.testing.assert_array_equal(x, y)
