"""How a model is split across tensor-parallel ranks, and the all-reduce it needs.

Heads and the MLP's intermediate dimension split as ``schema.sharding`` says
(the simulator sizes each rank's KV cache by the same rule). Column-parallel
layers slice output rows, row-parallel layers slice input columns and sum
partial outputs with an all-reduce.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from schema.sharding import HeadShard, head_partition, split_range

__all__ = ["HeadShard", "TPInfo", "head_partition", "split_range"]


@dataclass(frozen=True, slots=True)
class TPInfo:
    """This process's place in the tensor-parallel group."""

    rank: int = 0
    size: int = 1

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"invalid tensor-parallel rank {self.rank} of size {self.size}")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum ``x`` over the ranks in place (a no-op on one rank)."""
        if self.size > 1:
            dist.all_reduce(x)
        return x
