"""Long decode rows cut into pieces of their KV, attended apart and merged.

FlashInfer's planners split a sequence's KV into chunks only while the step's
chunks fit a budget of CTAs (two per SM for each KV head): in a decode batch of
more rows than that, or one whose CUDA graph pads it past that, a long request's
KV is walked by one CTA per head, and that walk decides the step's time (a
120,001-token request in a decode batch of 17: 30 ms, against 9.4 ms at 16;
``git show f45904a:reports/validate/h200/long_context/README.md``). Cutting such a
row into pieces of at most ``piece`` tokens, each a sequence of its own with the
row's query, bounds the walk; the pieces' outputs merge by their log-sum-exp (base
2, as FlashInfer returns it).

The piece spreads the decode rows' KV evenly over the budget: ``piece_tokens``
is ``max(min_tokens, total KV / slots)``, a whole number of pages. A step is cut
only where FlashInfer's own split leaves one CTA more than two pieces to walk
(``longest_walk``), and then only its rows longer than two pieces: a small batch
holding one long request, or a batch of rows of similar length, is planned as
it was (and keeps its CUDA graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

LN2 = math.log(2.0)


@dataclass(frozen=True, slots=True)
class Pieces:
    """The decode rows' sequences after the cut, in row order (a row's pieces in a run).

    ``kv_indptr`` counts pages from the first decode row's first page; the pieces of
    a row cover its pages in order, so the rows' page list serves the pieces as it is.
    ``merge_index[r]`` lists row ``r``'s pieces, padded with ``num_pieces`` (a row
    that ``merge`` fills with an empty state).
    """

    kv_indptr: np.ndarray  # int32 [V + 1]
    kv_lens: np.ndarray  # int32 [V]
    last_page_len: np.ndarray  # int32 [V]
    owner: np.ndarray  # int64 [V]: the decode row of each piece
    merge_index: np.ndarray  # int64 [R, max pieces of a row]

    @property
    def num_pieces(self) -> int:
        return int(self.kv_lens.shape[0])


def piece_tokens(kv_lens: np.ndarray, page_size: int, slots: int, min_tokens: int) -> int:
    """The piece length for decode rows of ``kv_lens`` tokens over ``slots`` CTAs a head."""
    even = -(-int(kv_lens.sum()) // max(slots, 1))
    tokens = max(min_tokens, even, page_size)
    return -(-tokens // page_size) * page_size


def longest_walk(pages: np.ndarray, budget: int, min_chunk: int) -> int:
    """The most pages one CTA walks when FlashInfer splits sequences of ``pages`` pages (one
    query tile each) into chunks: the smallest chunk of at least ``min_chunk`` pages that
    keeps the chunks within ``budget``, or the longest sequence when none does."""
    longest = int(pages.max())
    low, high = min(min_chunk, longest), longest
    while low < high:
        mid = (low + high) // 2
        if int((-(-pages // mid)).sum()) > budget:
            low = mid + 1
        else:
            high = mid
    return low


def plan_cut(
    kv_lens: np.ndarray,
    last_page_len: np.ndarray,
    page_size: int,
    slots: int,
    min_tokens: int,
    padding: int = 0,
) -> Pieces | None:
    """The cut of decode rows of ``kv_lens`` tokens over ``slots`` CTAs a head (planned with
    ``padding`` one-page rows more, as a CUDA graph pads its batch), or None where
    FlashInfer's own split leaves no CTA more than two pieces to walk."""
    piece = piece_tokens(kv_lens, page_size, slots, min_tokens)
    if kv_lens.size == 0 or int(kv_lens.max()) <= 2 * piece:
        return None
    pages = np.concatenate((-(-kv_lens.astype(np.int64) // page_size), np.ones(padding, np.int64)))
    if longest_walk(pages, slots, max(128 // page_size, 1)) * page_size <= 2 * piece:
        return None
    return cut(kv_lens, last_page_len, page_size, piece)


def cut(
    kv_lens: np.ndarray, last_page_len: np.ndarray, page_size: int, piece: int
) -> Pieces | None:
    """Decode rows (``kv_lens`` tokens each) with every row longer than two pieces cut into
    pieces of ``piece`` tokens (a multiple of ``page_size``; the last piece takes the rest);
    None when no row is that long."""
    if piece % page_size:
        raise ValueError(
            f"a piece of {piece} tokens is not a whole number of {page_size}-token pages"
        )
    lens = kv_lens.astype(np.int64)
    if lens.size == 0 or int(lens.max()) <= 2 * piece:
        return None
    piece_pages = piece // page_size
    pages = -(-lens // page_size)
    counts = np.where(lens > 2 * piece, -(-pages // piece_pages), 1)
    rows = lens.shape[0]
    owner = np.repeat(np.arange(rows, dtype=np.int64), counts)
    first = np.cumsum(counts) - counts
    index = np.arange(owner.shape[0], dtype=np.int64) - first[owner]
    last = index == counts[owner] - 1
    span = np.where(last, pages[owner] - index * piece_pages, piece_pages)
    kv_indptr = np.concatenate(([0], np.cumsum(span))).astype(np.int32)
    piece_lens = np.where(last, lens[owner] - index * piece, piece).astype(np.int32)
    piece_last = np.where(last, last_page_len.astype(np.int64)[owner], page_size).astype(np.int32)
    width = int(counts.max())
    column = np.arange(width, dtype=np.int64)
    merge_index = np.where(
        column[None, :] < counts[:, None], first[:, None] + column[None, :], owner.shape[0]
    )
    return Pieces(kv_indptr, piece_lens, piece_last, owner, merge_index)


def merge(out: torch.Tensor, lse: torch.Tensor, merge_index: torch.Tensor) -> torch.Tensor:
    """Each row's attention output from its pieces' outputs ``out`` (``[V + 1, heads, dim]``)
    and log-sum-exps ``lse`` (base 2, ``[V + 1, heads]``), whose last row is the empty state
    (a finite output, ``-inf``) that ``merge_index`` (``[rows, width]``) pads with."""
    rows, width = merge_index.shape
    flat = merge_index.reshape(-1)
    heads, dim = out.shape[1], out.shape[2]
    wide = torch.promote_types(out.dtype, torch.float32)
    v = out.index_select(0, flat).view(rows, width, heads, dim).to(wide)
    weight = torch.softmax(lse.index_select(0, flat).view(rows, width, heads) * LN2, dim=1)
    return (v * weight.unsqueeze(-1)).sum(dim=1).to(out.dtype)
