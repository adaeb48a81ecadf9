"""Long decode rows cut into pieces (``engine.attention.decode_pieces``): the cut covers
each row's KV exactly, and merging the pieces' attention gives the row's attention."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.attention.decode_pieces import cut, longest_walk, merge, piece_tokens, plan_cut


@st.composite
def rows(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, int, int]:
    page_size = draw(st.sampled_from([1, 4, 16]))
    lens = np.array(draw(st.lists(st.integers(1, 600), min_size=1, max_size=12)), np.int32)
    last = (lens - 1) % page_size + 1
    piece = page_size * draw(st.integers(1, 40))
    return lens, last.astype(np.int32), page_size, piece


@settings(max_examples=200, deadline=None)
@given(rows())
def test_the_cut_covers_each_row_in_order(case: tuple[np.ndarray, np.ndarray, int, int]) -> None:
    lens, last, page_size, piece = case
    pieces = cut(lens, last, page_size, piece)
    if pieces is None:
        assert int(lens.max()) <= 2 * piece
        return
    pages = -(-lens // page_size)
    span = np.diff(pieces.kv_indptr)
    assert pieces.kv_indptr[0] == 0 and pieces.kv_indptr[-1] == pages.sum()
    # each piece's tokens fill its pages but the last, which holds last_page_len of them
    assert (pieces.kv_lens == (span - 1) * page_size + pieces.last_page_len).all()
    assert ((pieces.last_page_len >= 1) & (pieces.last_page_len <= page_size)).all()
    for row in range(lens.shape[0]):
        mine = np.flatnonzero(pieces.owner == row)
        assert (np.diff(mine) == 1).all()  # a row's pieces in a run, rows in order
        assert pieces.kv_lens[mine].sum() == lens[row]
        assert pieces.last_page_len[mine[-1]] == last[row]
        if lens[row] > 2 * piece:
            assert (pieces.kv_lens[mine] <= piece).all()
        else:
            assert mine.shape[0] == 1
        listed = pieces.merge_index[row]
        assert (listed[: mine.shape[0]] == mine).all()
        assert (listed[mine.shape[0] :] == pieces.num_pieces).all()
    assert (np.diff(pieces.owner) >= 0).all()


def test_piece_tokens_spreads_the_kv_over_the_slots() -> None:
    lens = np.array([120_001] + [1025] * 16)
    assert piece_tokens(lens, 16, 33, 4096) == 4144  # 136,401 / 33 = 4,134 -> whole pages
    assert piece_tokens(np.array([500, 700]), 16, 33, 4096) == 4096
    assert piece_tokens(np.array([5]), 16, 33, 1) == 16
    pieces = cut(lens.astype(np.int32), np.ones(17, np.int32), 16, 4144)
    assert pieces is not None and pieces.num_pieces == 29 + 16


def test_longest_walk_follows_flashinfers_split() -> None:
    """A 120,001-token row (7,501 pages) among 1,025-token rows, budget 33 chunks."""
    long = np.array([7501] + [65] * 7)
    assert longest_walk(long, 33, 8) == 289  # 26 chunks for the long row: 7,501 / 26
    padded = np.concatenate((long, [65] * 9, [1] * 15))  # 17 rows in the graph of 32
    assert longest_walk(padded, 33, 8) == 3751  # two chunks left for it
    assert longest_walk(np.array([7501] + [65] * 40), 33, 8) == 7501  # no split at all
    assert longest_walk(np.array([5, 3]), 33, 8) == 5  # below the smallest chunk


def _rows(*lens: int) -> tuple[np.ndarray, np.ndarray]:
    kv = np.array(lens, np.int32)
    return kv, ((kv - 1) % 16 + 1).astype(np.int32)


@pytest.mark.parametrize(
    ("lens", "padding", "pieces"),
    [
        ((120_001,) + (1025,) * 7, 0, None),  # the graph of 8: FlashInfer gives it 26 chunks
        ((120_001,) + (1025,) * 16, 15, 29 + 16),  # 17 rows in the graph of 32: two chunks
        ((120_001,) + (1025,) * 63, 0, 22 + 63),  # 64 rows: no split at all; pieces of 5,600
        ((32_769,) * 16, 0, None),  # even rows: FlashInfer splits them in budget
        ((120_001,), 0, None),  # alone (a mixed step's decode): 33 chunks of its own
        ((1025,) * 40, 0, None),  # nothing long
    ],
)
def test_plan_cut_cuts_where_flashinfers_split_leaves_a_long_walk(
    lens: tuple[int, ...], padding: int, pieces: int | None
) -> None:
    kv, last = _rows(*lens)
    got = plan_cut(kv, last, 16, 33, 4096, padding)
    assert (got.num_pieces if got is not None else None) == pieces


def test_a_piece_must_be_whole_pages() -> None:
    with pytest.raises(ValueError, match="whole number"):
        cut(np.array([100], np.int32), np.array([4], np.int32), 16, 40)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One query ``[heads, dim]`` over ``k``/``v`` ``[n, heads, dim]``: output and base-2 LSE."""
    scores = torch.einsum("hd,nhd->hn", q, k) / math.sqrt(q.shape[-1])
    out = torch.einsum("hn,nhd->hd", torch.softmax(scores, dim=-1), v)
    return out, torch.logsumexp(scores, dim=-1) / math.log(2.0)


@settings(max_examples=30, deadline=None)
@given(rows(), st.integers(0, 2**31 - 1))
def test_merging_the_pieces_is_attending_the_row(
    case: tuple[np.ndarray, np.ndarray, int, int], seed: int
) -> None:
    lens, last, page_size, piece = case
    pieces = cut(lens, last, page_size, piece)
    if pieces is None:
        return
    gen = torch.Generator().manual_seed(seed)
    heads, dim = 2, 8
    q = torch.randn(lens.shape[0], heads, dim, generator=gen, dtype=torch.float64)
    kv = [torch.randn(2, int(n), heads, dim, generator=gen, dtype=torch.float64) for n in lens]
    # every piece attends its own stretch of its row's tokens, as the kernel would
    starts = np.concatenate(([0], np.cumsum(pieces.kv_lens)))
    row_start = {int(r): starts[np.flatnonzero(pieces.owner == r)[0]] for r in set(pieces.owner)}
    out = torch.zeros(pieces.num_pieces + 1, heads, dim, dtype=torch.float64)
    lse = torch.full((pieces.num_pieces + 1, heads), float("-inf"), dtype=torch.float64)
    for i, row in enumerate(pieces.owner):
        lo = int(starts[i] - row_start[int(row)])
        hi = lo + int(pieces.kv_lens[i])
        k, v = kv[row][0][lo:hi], kv[row][1][lo:hi]
        out[i], lse[i] = _attend(q[row], k, v)
    merged = merge(out, lse, torch.from_numpy(pieces.merge_index))
    for row in range(lens.shape[0]):
        want, _ = _attend(q[row], kv[row][0], kv[row][1])
        assert torch.allclose(merged[row], want, atol=1e-9), row


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_merge_kernel_equals_the_torch_merge() -> None:
    pytest.importorskip("triton")
    from engine.attention import merge_kernel

    lens = np.array([9000, 300, 20000, 4100], np.int32)
    pieces = cut(lens, (lens - 1) % 16 + 1, 16, 2048)
    assert pieces is not None
    gen = torch.Generator(device="cuda").manual_seed(5)
    count = pieces.num_pieces
    out = torch.randn(count + 1, 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
    out[-1] = 0
    lse = torch.randn(count + 1, 32, generator=gen, device="cuda") * 8
    lse[-1] = float("-inf")
    index = torch.from_numpy(pieces.merge_index).cuda()
    want = merge(out, lse, index).float()
    got = merge_kernel.merge(out, lse, index).float()
    assert torch.allclose(got, want, atol=1e-2, rtol=1e-2)
