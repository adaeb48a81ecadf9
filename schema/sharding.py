"""How a model's heads and MLP split across tensor-parallel ranks: the rule both worlds size by.

Attention is split by heads, keeping each query head with its KV head (GQA
groups stay whole). When the KV heads do not divide evenly, ranks get
contiguous ranges whose sizes differ by one (SmolLM2's 3 KV heads on 2 ranks:
2 + 1). With fewer KV heads than ranks (a multiple of them), each KV head's
query group is split over ``tp_size / num_kv_heads`` ranks, each holding a copy
of that KV head. The MLP intermediate dimension is split the same
uneven-but-contiguous way (``split_range``).
"""

from __future__ import annotations

from dataclasses import dataclass


def split_range(n: int, parts: int, index: int) -> tuple[int, int]:
    """``(start, size)`` of part ``index`` when ``n`` items go into ``parts`` contiguous parts."""
    if not 0 <= index < parts:
        raise ValueError(f"part index {index} out of range for {parts} parts")
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, base + (1 if index < extra else 0)


@dataclass(frozen=True, slots=True)
class HeadShard:
    """The query heads ``[q_start, q_start + q_count)`` and KV heads a rank holds."""

    q_start: int
    q_count: int
    kv_start: int
    kv_count: int


def head_partition(num_heads: int, num_kv_heads: int, tp_size: int, rank: int) -> HeadShard:
    """The attention heads of ``rank`` out of ``tp_size`` (see module docstring)."""
    group = num_heads // num_kv_heads
    if num_kv_heads >= tp_size:
        kv_start, kv_count = split_range(num_kv_heads, tp_size, rank)
        return HeadShard(kv_start * group, kv_count * group, kv_start, kv_count)
    ranks_per_kv = tp_size // num_kv_heads
    if tp_size % num_kv_heads or group < ranks_per_kv:
        raise ValueError(
            f"cannot split {num_heads} query / {num_kv_heads} KV heads over {tp_size} ranks: "
            "with fewer KV heads than ranks, the ranks must be a multiple of the KV heads and "
            "each rank needs a query head"
        )
    kv = rank // ranks_per_kv
    start, count = split_range(group, ranks_per_kv, rank % ranks_per_kv)
    return HeadShard(kv * group + start, count, kv, 1)
