# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""``decode_pieces.merge`` in one Triton kernel: a decode row's pieces merged by their LSE.

The torch version launches about eight small kernels a layer (gathers, casts, a
softmax, a product, a sum), which in an eager decode step of an 8B model is host
time the device waits for. Here one program merges one row's pieces for one
head, in float32, with the same running rescale FlashInfer uses between KV
chunks (base-2 LSEs); the padding entries (LSE ``-inf``) weigh nothing.

Imports Triton, so only the CUDA path imports this module.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _merge_kernel(out, lse, index, dst, width, heads, D: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, D)
    top = tl.full([], float("-inf"), tl.float32)
    total = tl.zeros([], tl.float32)
    acc = tl.zeros([D], tl.float32)
    for j in range(0, width):
        piece = tl.load(index + row * width + j)
        s = tl.load(lse + piece * heads + head)
        v = tl.load(out + (piece * heads + head) * D + cols).to(tl.float32)
        new_top = tl.maximum(top, s)
        keep = tl.exp2(top - new_top)
        weight = tl.exp2(s - new_top)
        acc = acc * keep + v * weight
        total = total * keep + weight
        top = new_top
    tl.store(dst + (row * heads + head) * D + cols, (acc / total).to(dst.dtype.element_ty))


def merge(out: torch.Tensor, lse: torch.Tensor, merge_index: torch.Tensor) -> torch.Tensor:
    """As ``engine.attention.decode_pieces.merge`` (the same arguments and result)."""
    rows, width = merge_index.shape
    heads, dim = out.shape[1], out.shape[2]
    if not (out.is_contiguous() and lse.is_contiguous() and merge_index.is_contiguous()):
        raise ValueError("merge needs contiguous outputs, LSEs and index")
    dst = torch.empty(rows, heads, dim, dtype=out.dtype, device=out.device)
    if rows:
        _merge_kernel[(rows, heads)](out, lse, merge_index, dst, width, heads, D=dim)
    return dst
