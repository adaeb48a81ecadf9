"""Paged attention against dense attention, on random mixed batches (Hypothesis).

Each request has a sequence of random K/V; a prefix of it is already in the
pool (written at earlier steps, pages scattered at random), and the step adds
either a prefill chunk or one decode token. The step goes the runner's way:
``StepLayout`` -> request table -> one upload -> metadata gathered from the
table. Every output row must equal plain causal attention over the request's
whole sequence up to that row's position.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple
from unittest.mock import patch

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from core.scheduler import DecodeSlot, Plan, PrefillChunk
from engine.attention import get_backend, torch_backend
from engine.attention.backend import AttentionBackend
from engine.kvcache import KVPool
from engine.runner.device_step import DeviceStep
from engine.runner.inputs import StepInputs
from engine.runner.layout import StepLayout
from engine.runner.staging import Staging
from engine.runner.table import RequestTable
from engine.sampling import SamplingParams
from engine.sampling.sampler import SamplingArrays

torch.set_num_threads(1)
PAGE, NUM_PAGES, Q_HEADS, KV_HEADS, DIM = 4, 64, 4, 2, 8

# per request: (cached tokens, new tokens, decode?)
request = st.tuples(st.integers(0, 20), st.integers(1, 12), st.booleans())


class _Seq(NamedTuple):
    start: int  # first position computed at this step
    q: torch.Tensor  # [L, q_heads, D]
    k: torch.Tensor  # [L, kv_heads, D]
    v: torch.Tensor
    decode: bool


def _dense(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pos: int) -> torch.Tensor:
    """Attention of one query row ``[heads, D]`` at ``pos`` over ``k``/``v`` ``[L, kv, D]``."""
    k = k[: pos + 1].repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    v = v[: pos + 1].repeat_interleave(Q_HEADS // KV_HEADS, dim=1)
    scores = torch.einsum("hd,lhd->hl", q, k) / math.sqrt(DIM)
    return torch.einsum("hl,lhd->hd", scores.softmax(-1), v)


@settings(max_examples=40, deadline=None)
@given(
    steps=st.lists(st.lists(request, min_size=1, max_size=5), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
    row_block=st.sampled_from([1, 3, 128]),
)
def test_paged_attention_equals_dense(
    steps: list[list[tuple[int, int, bool]]], seed: int, row_block: int
) -> None:
    """One backend over a few steps of other sizes (it reuses its gather buffers); a chunk
    after a cached prefix in blocks of ``row_block`` rows."""
    gen = torch.Generator().manual_seed(seed)
    pool = KVPool(1, NUM_PAGES, PAGE, KV_HEADS, DIM, torch.float32, torch.device("cpu"))
    backend = get_backend("torch", "cpu", torch.float32, DIM)(pool, Q_HEADS, 1.0 / math.sqrt(DIM))
    with patch.object(torch_backend, "PREFIX_ROW_BLOCK", row_block):
        for requests in steps:
            _step_equals_dense(backend, pool, requests, gen)


def _step_equals_dense(
    backend: AttentionBackend, pool: KVPool, requests: list[tuple[int, int, bool]],
    gen: torch.Generator,
) -> None:  # fmt: skip
    free = torch.randperm(NUM_PAGES, generator=gen).tolist()
    prefill: list[PrefillChunk] = []
    decode: list[DecodeSlot] = []
    seqs: list[_Seq] = []
    for i, (cached, new, is_decode) in enumerate(requests):
        length = cached + (1 if is_decode else new)
        pages = tuple(free.pop() for _ in range(-(-length // PAGE)))
        k = torch.randn(length, KV_HEADS, DIM, generator=gen)
        v = torch.randn(length, KV_HEADS, DIM, generator=gen)
        q = torch.randn(length, Q_HEADS, DIM, generator=gen)
        start = length - 1 if is_decode else cached
        if start:
            page_ids = torch.tensor(pages)
            p = torch.arange(start)
            pool.write(0, page_ids[p // PAGE] * PAGE + p % PAGE, k[:start], v[:start])
        seqs.append(_Seq(start, q, k, v, is_decode))
        if is_decode:
            decode.append(DecodeSlot(f"r{i}", start, pages))
        else:
            prefill.append(PrefillChunk(f"r{i}", start, length - start, True, pages))
    plan = Plan(0, prefill=tuple(prefill), decode=tuple(decode))
    order = [s for s in seqs if not s.decode] + [s for s in seqs if s.decode]
    n_sample = len(plan.sampling_rids())
    inputs = StepInputs(
        [[0] * (len(s.q) - s.start) for s in order if not s.decode],
        [0] * len(decode),
        [SamplingParams()] * n_sample,
        [0] * n_sample,
    )
    layout = StepLayout.build(plan, inputs, PAGE, 10)
    # a table with rows already in use, so slots and page-table rows differ
    table = RequestTable(8, 16, NUM_PAGES, torch.device("cpu"))
    table.assign(["x", "y"], [(1, 2), (3,)])
    slots, writes = table.assign(layout.rids, layout.pages)
    sampling = SamplingArrays.build(inputs.sampling, inputs.output_index, 10)
    source = np.full(layout.num_tokens, -1, dtype=np.int64)
    step = DeviceStep.upload(layout, source, slots, writes, sampling, Staging(torch.device("cpu")))
    backend.prepare(step.metadata(layout, table, pinned=False))
    out = backend.forward(
        0,
        torch.cat([s.q[s.start :] for s in order]),
        torch.cat([s.k[s.start :] for s in order]),
        torch.cat([s.v[s.start :] for s in order]),
    )
    row = 0
    for s in order:
        for pos in range(s.start, len(s.q)):
            expected = _dense(s.q[pos], s.k, s.v, pos)
            torch.testing.assert_close(out[row], expected, atol=1e-5, rtol=1e-5)
            row += 1
    assert row == out.shape[0]


@settings(max_examples=100, deadline=None)
@given(lengths=st.lists(st.integers(1, 5000), min_size=1, max_size=64))
def test_decode_batches_cover_every_row_once_and_pad_at_most_twofold(lengths: list[int]) -> None:
    from engine.attention.torch_backend import length_buckets

    buckets = length_buckets(lengths)
    flat = [i for b in buckets for i in b]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)  # ascending, batch after batch
    for b in buckets:
        assert max(lengths[i] for i in b) <= 2 * lengths[b[0]]
    for before, after in itertools.pairwise(buckets):
        assert lengths[after[0]] > 2 * lengths[before[0]]  # a new batch only when needed
