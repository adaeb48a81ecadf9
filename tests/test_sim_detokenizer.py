"""The detokenizer queue: the vectorized run equals serving the steps one by one."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.detokenizer import DetokenizerQueue


@settings(max_examples=50, deadline=None)
@given(
    gaps=st.lists(st.floats(0, 2e-3), min_size=1, max_size=40),
    tokens=st.integers(1, 300),
    backlog=st.floats(0, 5e-2),
)
def test_run_equals_one_by_one(gaps: list[float], tokens: int, backlog: float) -> None:
    arrive = np.cumsum(gaps) + 1.0
    one, run = DetokenizerQueue(1e-5), DetokenizerQueue(1e-5)
    for q in (one, run):
        q.serve_one(1.0, 10)
        q.last_departure += backlog  # earlier work still in service
    single = np.array([one.serve_one(float(a), tokens) for a in arrive])
    vector = run.serve_run(arrive, tokens)
    np.testing.assert_allclose(vector, single, rtol=0, atol=1e-12)
    assert (np.diff(vector) >= tokens * 1e-5 - 1e-12).all()  # one message at a time
    assert (vector >= arrive + tokens * 1e-5 - 1e-12).all()
    t1, n1 = one.queue_samples()
    t2, n2 = run.queue_samples()
    np.testing.assert_allclose(t1, t2, atol=1e-12)
    np.testing.assert_array_equal(n1, n2)
    assert (n1 >= 0).all() and (len(n1) == 0 or n1[-1] == 0)


def test_busy_detokenizer_builds_a_queue() -> None:
    q = DetokenizerQueue(1e-3)
    departs = q.serve_run(np.array([0.0, 0.001, 0.002]), 10)  # 10 ms of work each
    np.testing.assert_allclose(departs, [0.01, 0.02, 0.03])
    times, lens = q.queue_samples()
    np.testing.assert_allclose(times, [0.001, 0.002, 0.01, 0.02])
    np.testing.assert_array_equal(lens, [1, 2, 1, 0])
