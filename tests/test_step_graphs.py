"""What a CUDA graph replay relies on, checked on CPU: padding a step to the captured batch
size (``graphs.padded``) and widening its short extends to the verify graph's rows a sequence
(``widen``) change nothing for its real rows. Each step runs through the torch backend's
attention both ways: the real rows must come out as they do as given, and the padding may
write only the pool's scratch page; and through SmolLM2, a widened step gives the logits of
the step as laid out. The replays themselves run on CUDA
(``tests/test_speculative_engine.py``, ``tests/test_gpu_engine.py``)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.scheduler.pages import pages_for
from engine.attention import get_backend
from engine.attention.metadata import AttentionMetadata
from engine.kvcache import KVPool
from engine.runner.graphs import padded
from engine.runner.widen import widen

torch.set_num_threads(1)
NUM_PAGES, Q_HEADS, KV_HEADS, DIM = 48, 4, 2, 8


def _meta(
    contexts: list[int], rows: list[int], page_size: int, gen: torch.Generator
) -> tuple[AttentionMetadata, torch.Tensor]:
    """Sequences of ``contexts`` positions, the last ``rows`` of each new at this step, on
    pages drawn at random; and the write slots of their rows."""
    counts = [pages_for(c, page_size) for c in contexts]
    order = torch.randperm(NUM_PAGES, generator=gen)[: sum(counts)].to(torch.int32)
    kv_indptr = np.concatenate(([0], np.cumsum(counts))).astype(np.int32)
    slots = []
    for i, (context, new) in enumerate(zip(contexts, rows, strict=True)):
        pages = order[kv_indptr[i] : kv_indptr[i + 1]]
        for pos in range(context - new, context):
            slots.append(int(pages[pos // page_size]) * page_size + pos % page_size)
    lens = np.array(contexts, dtype=np.int32)
    uniform = all(r == 1 for r in rows)
    meta = AttentionMetadata(
        num_prefill=0 if uniform else len(contexts),
        qo_indptr=torch.from_numpy(np.concatenate(([0], np.cumsum(rows))).astype(np.int32)),
        kv_indptr=torch.from_numpy(kv_indptr),
        kv_lens=torch.from_numpy(lens),
        last_page_len=torch.from_numpy((lens - 1) % page_size + 1),
        kv_indices=order,
        out_slots=torch.tensor(slots, dtype=torch.int64),
        page_size=page_size,
    )
    return meta, meta.out_slots


@settings(max_examples=60, deadline=None)
@given(
    extra=st.lists(st.integers(0, 9), min_size=1, max_size=5),
    width=st.integers(1, 6),
    page_size=st.sampled_from([1, 4, 16]),
    pad=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_padding_leaves_the_real_rows_alone(
    extra: list[int], width: int, page_size: int, pad: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    contexts = [width + e for e in extra]
    if sum(pages_for(c, page_size) for c in contexts) > NUM_PAGES:
        contexts = contexts[:1]
    pool = KVPool(1, NUM_PAGES, page_size, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    for cache in (pool.k[0], pool.v[0]):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    start = (pool.k[0].clone(), pool.v[0].clone())
    backend = get_backend("torch", "cpu", torch.float32, DIM)(pool, Q_HEADS, 1 / math.sqrt(DIM))
    meta, _ = _meta(contexts, [width] * len(contexts), page_size, gen)
    n, bs = len(contexts), len(contexts) + pad
    q = torch.randn(bs * width, Q_HEADS, DIM, generator=gen)
    k = torch.randn(bs * width, KV_HEADS, DIM, generator=gen)
    v = torch.randn(bs * width, KV_HEADS, DIM, generator=gen)
    rows = n * width

    backend.prepare(meta)
    want = backend.forward(0, q[:rows], k[:rows], v[:rows])
    after = (pool.k[0].clone(), pool.v[0].clone())

    pool.k[0].copy_(start[0])
    pool.v[0].copy_(start[1])
    scratch_slot = pool.scratch_page * page_size
    out_slots = torch.full((bs * width,), scratch_slot, dtype=torch.int64)
    out_slots[:rows] = meta.out_slots
    scratch = torch.full((bs * pages_for(width, page_size),), pool.scratch_page, dtype=torch.int32)
    big = padded(meta, bs, width, page_size, scratch, out_slots)
    assert big.num_seqs == bs and big.num_prefill == (0 if width == 1 else bs)
    assert int(big.kv_indptr[-1]) == big.kv_indices.numel()
    backend.prepare(big)
    got = backend.forward(0, q, k, v)

    torch.testing.assert_close(got[:rows], want)
    assert bool(torch.isfinite(got).all())
    for cache, wanted in zip((pool.k[0], pool.v[0]), after, strict=True):
        torch.testing.assert_close(cache[:NUM_PAGES], wanted[:NUM_PAGES], rtol=0, atol=0)


def test_padding_from_nothing_is_the_capture_step() -> None:
    """The step a graph is captured on: ``bs`` sequences of ``width`` rows, all scratch."""
    scratch = torch.full((8 * 2,), 9, dtype=torch.int32)
    out_slots = torch.full((8 * 5,), 9 * 4, dtype=torch.int64)
    meta = padded(None, 8, 5, 4, scratch, out_slots)
    assert meta.qo_indptr.tolist() == list(range(0, 41, 5))
    assert meta.kv_indptr.tolist() == list(range(0, 17, 2))
    assert meta.kv_lens.tolist() == [5] * 8
    assert meta.last_page_len.tolist() == [1] * 8
    assert meta.kv_indices.tolist() == [9] * 16
    assert meta.num_prefill == 8


@settings(max_examples=60, deadline=None)
@given(
    seqs=st.lists(st.tuples(st.integers(1, 5), st.integers(0, 9)), min_size=1, max_size=5),
    extra_width=st.integers(0, 3),
    page_size=st.sampled_from([1, 4, 16]),
    seed=st.integers(0, 2**16),
)
def test_widening_leaves_the_real_rows_alone(
    seqs: list[tuple[int, int]], extra_width: int, page_size: int, seed: int
) -> None:
    """Sequences of 1-5 new rows after 0-9 cached positions, widened to the longest plus
    ``extra_width`` rows each."""
    gen = torch.Generator().manual_seed(seed)
    rows = [r for r, _ in seqs]
    contexts = [r + cached for r, cached in seqs]
    width = max(rows) + extra_width
    if sum(pages_for(c + width, page_size) for c in contexts) > NUM_PAGES:
        rows, contexts = rows[:1], contexts[:1]
    pool = KVPool(1, NUM_PAGES, page_size, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    for cache in (pool.k[0], pool.v[0]):
        cache.copy_(torch.randn(cache.shape, generator=gen))
    start = (pool.k[0].clone(), pool.v[0].clone())
    backend = get_backend("torch", "cpu", torch.float32, DIM)(pool, Q_HEADS, 1 / math.sqrt(DIM))
    meta, _ = _meta(contexts, rows, page_size, gen)
    total = sum(rows)
    q = torch.randn(total, Q_HEADS, DIM, generator=gen)
    k = torch.randn(total, KV_HEADS, DIM, generator=gen)
    v = torch.randn(total, KV_HEADS, DIM, generator=gen)
    ids = torch.randint(0, 1000, (total,), generator=gen)
    positions = torch.cat([torch.arange(c - r, c) for c, r in zip(contexts, rows, strict=True)])

    backend.prepare(meta)
    want = backend.forward(0, q, k, v)
    after = (pool.k[0].clone(), pool.v[0].clone())

    pool.k[0].copy_(start[0])
    pool.v[0].copy_(start[1])
    step = widen(ids, positions, meta, width, pool.scratch_page)
    n = len(rows)
    assert step.meta.num_seqs == n and step.meta.num_prefill == n
    assert step.meta.qo_indptr.tolist() == [width * i for i in range(n + 1)]
    assert int(step.meta.kv_indptr[-1]) == step.meta.kv_indices.numel()
    assert torch.equal(step.input_ids[step.rows], ids)
    assert torch.equal(step.positions[step.rows], positions)
    scratch_slot = pool.scratch_page * page_size
    padding = torch.ones(n * width, dtype=torch.bool)
    padding[step.rows] = False
    assert bool((step.meta.out_slots[padding] == scratch_slot).all())

    def spread(x: torch.Tensor) -> torch.Tensor:
        out = torch.randn((n * width, *x.shape[1:]), generator=gen)
        out[step.rows] = x
        return out

    backend.prepare(step.meta)
    got = backend.forward(0, spread(q), spread(k), spread(v))
    torch.testing.assert_close(got[step.rows], want)
    assert bool(torch.isfinite(got).all())
    for cache, wanted in zip((pool.k[0], pool.v[0]), after, strict=True):
        torch.testing.assert_close(cache[:NUM_PAGES], wanted[:NUM_PAGES], rtol=0, atol=0)


def test_widening_refuses_a_longer_sequence() -> None:
    gen = torch.Generator().manual_seed(0)
    meta, _ = _meta([6, 3], [4, 1], 4, gen)
    ids = torch.zeros(5, dtype=torch.int64)
    with pytest.raises(ValueError, match="a sequence of 4 rows does not widen to 3"):
        widen(ids, ids.clone(), meta, 3, NUM_PAGES)


def test_a_widened_step_gives_the_models_logits(monkeypatch: pytest.MonkeyPatch) -> None:
    """SmolLM2 on CPU through the runner, the verify plans of the CUDA tests: each step whose
    sequences are at most 1 + K = 4 rows run widened (eagerly here, where CUDA replays the
    verify graph) gives the logits of the step as laid out."""
    from speculative_loop import cpu_runner
    from test_speculative_engine import _verify_plans

    reference, runner = cpu_runner(), cpu_runner()
    eager = runner._run_model
    widened = []

    def run_widened(
        layout: Any, ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        if not layout.num_prefill or int(np.diff(layout.qo_indptr).max()) > 4:
            return eager(layout, ids, positions, meta)
        step = widen(ids, positions, meta, 4, runner.kv.scratch_page)
        widened.append(layout.num_seqs)
        runner.attention.prepare(step.meta)
        hidden = runner.model(step.input_ids, step.positions, runner.attention)
        return hidden.index_select(0, step.rows)

    monkeypatch.setattr(runner, "_run_model", run_widened)
    prompt = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(3)).tolist()
    for plan, inputs in _verify_plans(prompt):
        want = reference.logits(plan, inputs)
        got = runner.logits(plan, inputs)
        assert want is not None and got is not None
        torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)
    assert widened == [3, 3]  # spans of 2 and 4 rows beside a plain decode slot; then 3 of 4
