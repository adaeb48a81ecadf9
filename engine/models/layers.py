"""Building blocks of a Llama-family model: RMSNorm and tensor-parallel linear layers.

Every sharded parameter records how it is cut from the full checkpoint tensor in
``module.shards[param_name] = (dim, start, size)``; the loader and the dummy
initializer read it, so one full tensor yields each rank's slice.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.parallel import TPInfo

Shard = tuple[int, int, int]


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    """RMS normalization computed in float32, scaled by a learned weight (HF Llama order)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.eps = eps
        self.weight = _param((dim,), dtype, device)
        self.shards: dict[str, Shard] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` holding output rows ``[start, start + out_local)`` of the full layer."""

    def __init__(
        self,
        in_features: int,
        out_local: int,
        start: int,
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.weight = _param((out_local, in_features), dtype, device)
        self.bias = _param((out_local,), dtype, device) if bias else None
        self.shards: dict[str, Shard] = {"weight": (0, start, out_local)}
        if bias:
            self.shards["bias"] = (0, start, out_local)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = sum over ranks (x_local W_local^T) + b``: input columns are split, outputs all-reduced.

    The bias is added once, after the all-reduce.
    """

    def __init__(
        self,
        in_local: int,
        out_features: int,
        start: int,
        bias: bool,
        tp: TPInfo,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.weight = _param((out_features, in_local), dtype, device)
        self.bias = _param((out_features,), dtype, device) if bias else None
        self.shards: dict[str, Shard] = {"weight": (1, start, in_local)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        if self.bias is not None:
            y = y + self.bias
        return y
