# mypy: disable-error-code="untyped-decorator,no-untyped-def"
"""One Triton kernel for what a layer does between its QKV matmul and attention.

Unfused, a decode step runs per layer: (QK-norm: two RMSNorms), rotary on Q and
K, then two index copies of K and V into the paged pool; in a CUDA graph of a
small batch each of these 3-5 kernels costs a few microseconds of launch and
tail, whatever the little data it touches. ``qkv_rope_store`` does it in one
launch, reading the packed QKV rows once:

    q[t, h]   <- rope(norm_q(q[t, h]), pos[t])           in place, in ``qkv``
    K[slot[t], h] <- rope(norm_k(k[t, h]), pos[t])        into the pool
    V[slot[t], h] <- v[t, h]                              into the pool

with the same arithmetic as FlashInfer's kernels (RMSNorm in float32 with its
weight, rounded to the model's dtype; rotary in float32 from the float32
``cos_sin`` cache in the ``rotate_half`` layout, see ``engine.models.rotary``).
One program handles one token's Q heads, K heads or V heads (grid ``[T, 3]``).

Imports Triton, so only the CUDA path imports this module (see ``engine.models.ops``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rope_heads(
    src,
    dst,
    cos,
    sin,
    weight,
    eps,
    n_heads,
    cols,
    HP2: tl.constexpr,
    D: tl.constexpr,
    NORM: tl.constexpr,
):
    """Rows ``[n_heads, D]`` at ``src`` (head stride D), normed and rotated, to ``dst``."""
    HALF: tl.constexpr = D // 2
    heads = tl.arange(0, HP2)
    mask = heads[:, None] < n_heads
    offs = heads[:, None] * D + cols[None, :]
    x1 = tl.load(src + offs, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + offs + HALF, mask=mask, other=0.0).to(tl.float32)
    if NORM:
        w1 = tl.load(weight + cols).to(tl.float32)
        w2 = tl.load(weight + HALF + cols).to(tl.float32)
        rrms = tl.rsqrt((tl.sum(x1 * x1, 1) + tl.sum(x2 * x2, 1)) / D + eps)
        x1 = (x1 * rrms[:, None] * w1[None, :]).to(dst.dtype.element_ty).to(tl.float32)
        x2 = (x2 * rrms[:, None] * w2[None, :]).to(dst.dtype.element_ty).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst + offs, o1.to(dst.dtype.element_ty), mask=mask)
    tl.store(dst + offs + HALF, o2.to(dst.dtype.element_ty), mask=mask)


@triton.jit
def _qkv_rope_store_kernel(
    qkv,
    row_stride,
    positions,
    cos_sin,
    q_weight,
    k_weight,
    eps,
    slots,
    k_cache,
    v_cache,
    NQ: tl.constexpr,
    NKV: tl.constexpr,
    NQ_P2: tl.constexpr,
    NKV_P2: tl.constexpr,
    D: tl.constexpr,
    NORM: tl.constexpr,
):
    HALF: tl.constexpr = D // 2
    t = tl.program_id(0).to(tl.int64)
    part = tl.program_id(1)
    cols = tl.arange(0, HALF)
    row = qkv + t * row_stride
    slot = tl.load(slots + t).to(tl.int64)
    if part == 2:
        heads = tl.arange(0, NKV_P2)
        mask = heads[:, None] < NKV
        offs = heads[:, None] * D + cols[None, :]
        src = row + (NQ + NKV) * D + offs
        dst = v_cache + slot * (NKV * D) + offs
        tl.store(dst, tl.load(src, mask=mask), mask=mask)
        tl.store(dst + HALF, tl.load(src + HALF, mask=mask), mask=mask)
    else:
        pos = tl.load(positions + t).to(tl.int64)
        cos = tl.load(cos_sin + pos * D + cols)
        sin = tl.load(cos_sin + pos * D + HALF + cols)
        if part == 0:
            _rope_heads(row, row, cos, sin, q_weight, eps, NQ, cols, NQ_P2, D, NORM)
        else:
            dst = k_cache + slot * (NKV * D)
            _rope_heads(row + NQ * D, dst, cos, sin, k_weight, eps, NKV, cols, NKV_P2, D, NORM)


def qkv_rope_store(
    qkv: torch.Tensor,
    num_q: int,
    num_kv: int,
    head_dim: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    slots: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    q_weight: torch.Tensor | None = None,
    k_weight: torch.Tensor | None = None,
    eps: float = 0.0,
) -> torch.Tensor:
    """Rotate (and QK-norm) the Q heads of ``qkv`` in place, store K and V at ``slots``.

    ``qkv`` is ``[T, (num_q + 2 num_kv) * head_dim]`` with unit stride along its rows
    (the QKV matmul's output); ``k_cache``/``v_cache`` are the pool's flat
    ``[slots, num_kv, head_dim]`` layers; ``slots`` and ``positions`` are ``[T]``.
    Norm weights are both given (Qwen3) or both None. Returns Q as a
    ``[T, num_q, head_dim]`` view of ``qkv``.
    """
    t = qkv.shape[0]
    if qkv.stride(1) != 1 or qkv.shape[1] != (num_q + 2 * num_kv) * head_dim:
        raise ValueError(f"qkv must be [T, {(num_q + 2 * num_kv) * head_dim}] with unit stride")
    norm = q_weight is not None and k_weight is not None
    if t:
        _qkv_rope_store_kernel[(t, 3)](
            qkv,
            qkv.stride(0),
            positions,
            cos_sin,
            q_weight if norm else cos_sin,
            k_weight if norm else cos_sin,
            eps,
            slots,
            k_cache,
            v_cache,
            NQ=num_q,
            NKV=num_kv,
            NQ_P2=triton.next_power_of_2(num_q),
            NKV_P2=triton.next_power_of_2(num_kv),
            D=head_dim,
            NORM=norm,
            num_warps=4,
        )
    return qkv[:, : num_q * head_dim].view(t, num_q, head_dim)
