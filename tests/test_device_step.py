"""A step's KV indices and write slots laid out on the host equal the device's gather from
the request table, and the input ids resolved from the previous step's samples are the same
whether every row or only some come from them."""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention.metadata import AttentionMetadata
from engine.runner.device_step import host_indices
from engine.runner.layout import StepLayout
from engine.runner.table import RequestTable

NUM_PAGES = 64


@st.composite
def layouts(draw: st.DrawFn) -> StepLayout:
    """Sequences of 1-5 rows at the end of their context, each over its own page tuple
    (possibly longer than the context needs, as a plan's may be), in any page size."""
    page_size = draw(st.sampled_from([1, 4, 16]))
    n = draw(st.integers(1, 6))
    rows = [draw(st.integers(1, 5)) for _ in range(n)]
    kv_lens = np.array([r + draw(st.integers(0, 40)) for r in rows], dtype=np.int32)
    page_counts = (-(-kv_lens // page_size)).astype(np.int32)
    pages = [
        tuple(draw(st.lists(st.integers(0, NUM_PAGES - 1), min_size=c, max_size=c + 2)))
        for c in page_counts.tolist()
    ]
    qo_indptr = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(rows, out=qo_indptr[1:])
    positions = np.concatenate(
        [np.arange(k - r, k, dtype=np.int64) for k, r in zip(kv_lens.tolist(), rows, strict=True)]
    )
    return StepLayout(
        rids=[f"r{i}" for i in range(n)],
        pages=pages,
        input_ids=np.zeros(int(qo_indptr[-1]), dtype=np.int64),
        positions=positions,
        qo_indptr=qo_indptr,
        kv_lens=kv_lens,
        page_counts=page_counts,
        sample_rows=qo_indptr[1:].astype(np.int64) - 1,
        drafts=[()] * n,
        num_prefill=sum(1 for r in rows if r > 1),
        page_size=page_size,
    )


@settings(max_examples=60, deadline=None)
@given(layout=layouts())
def test_host_indices_equal_the_tables_gather(layout: StepLayout) -> None:
    max_pages = max(len(p) for p in layout.pages)
    table = RequestTable(8, max_pages, NUM_PAGES, torch.device("cpu"))
    slots, writes = table.assign(layout.rids, layout.pages)
    table.apply(*(torch.from_numpy(w) for w in writes))
    slots_t = torch.from_numpy(slots)
    token_slots = torch.from_numpy(np.repeat(slots, np.diff(layout.qo_indptr)))
    kv_indptr = layout.kv_indptr
    kv_indices, out_slots = AttentionMetadata.gather(
        table.pages,
        slots_t,
        torch.from_numpy(layout.page_counts),
        torch.from_numpy(kv_indptr),
        int(kv_indptr[-1]),
        token_slots,
        torch.from_numpy(layout.positions),
        layout.page_size,
    )
    host_kv, host_out = host_indices(layout)
    assert host_kv.dtype == np.int32 and host_out.dtype == np.int64
    np.testing.assert_array_equal(host_kv, kv_indices.numpy())
    np.testing.assert_array_equal(host_out, out_slots.numpy())
