"""Building blocks of a Llama-family model: RMSNorm and tensor-parallel linear layers.

A column-parallel layer may pack several checkpoint tensors into one weight (Q, K
and V as ``qkv_proj``; gate and up as ``gate_up_proj``), so a step runs one matmul
where the checkpoint has two or three. Each packed part records where its rows sit
in the local weight and how this rank's slice is cut from the full checkpoint
tensor: ``Part(name, full_rows, start, rows)`` takes rows ``[start, start + rows)``
of the checkpoint tensor ``name``. The loader and the dummy initializer read
``checkpoint_tensors()``, so one full tensor yields each rank's slice.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.distributed.parallel import TPInfo
from engine.models.ops import TorchOps


def _param(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


@dataclass(frozen=True, slots=True)
class Part:
    """Rows ``[start, start + rows)`` of the checkpoint tensor ``name`` (``full_rows`` long)."""

    name: str
    full_rows: int
    start: int
    rows: int


@dataclass(frozen=True, slots=True)
class CheckpointTensor:
    """Where one checkpoint tensor's slice for this rank goes.

    ``target`` is a view of a model parameter; it receives the slice ``index`` of
    the full tensor of shape ``full_shape``.
    """

    name: str
    full_shape: tuple[int, ...]
    index: tuple[slice, ...]
    target: torch.Tensor


class RMSNorm(nn.Module):
    """RMS normalization computed in float32, scaled by a learned weight (HF Llama order)."""

    def __init__(
        self, dim: int, eps: float, ops: TorchOps, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__()
        self.eps = eps
        self.ops = ops
        self.weight = _param((dim,), dtype, device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rms_norm(x, self.weight, self.eps)

    def add_forward(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``; may reuse the storage of both inputs."""
        return self.ops.add_rms_norm(x, residual, self.weight, self.eps)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T + b`` over the packed output rows ``parts`` of this rank."""

    def __init__(
        self,
        in_features: int,
        parts: list[Part],
        bias: bool,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.parts = parts
        out_local = sum(p.rows for p in parts)
        self.weight = _param((out_local, in_features), dtype, device)
        self.bias = _param((out_local,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def checkpoint_tensors(self, prefix: str) -> Iterator[CheckpointTensor]:
        row = 0
        in_features = self.weight.shape[1]
        for part in self.parts:
            rows = slice(part.start, part.start + part.rows)
            yield CheckpointTensor(
                f"{prefix}{part.name}.weight",
                (part.full_rows, in_features),
                (rows, slice(None)),
                self.weight[row : row + part.rows],
            )
            if self.bias is not None:
                yield CheckpointTensor(
                    f"{prefix}{part.name}.bias",
                    (part.full_rows,),
                    (rows,),
                    self.bias[row : row + part.rows],
                )
            row += part.rows


class RowParallelLinear(nn.Module):
    """``y = sum over ranks (x_local W_local^T) + b``: input columns are split, outputs all-reduced.

    The bias is added once, after the all-reduce.
    """

    def __init__(
        self,
        name: str,
        full_in: int,
        start: int,
        in_local: int,
        out_features: int,
        bias: bool,
        tp: TPInfo,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.name = name
        self.full_in = full_in
        self.start = start
        self.tp = tp
        self.weight = _param((out_features, in_local), dtype, device)
        self.bias = _param((out_features,), dtype, device) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.tp.all_reduce(F.linear(x, self.weight))
        if self.bias is not None:
            y = y + self.bias
        return y

    def checkpoint_tensors(self, prefix: str) -> Iterator[CheckpointTensor]:
        out_features, in_local = self.weight.shape
        cols = slice(self.start, self.start + in_local)
        yield CheckpointTensor(
            f"{prefix}{self.name}.weight",
            (out_features, self.full_in),
            (slice(None), cols),
            self.weight,
        )
        if self.bias is not None:
            yield CheckpointTensor(
                f"{prefix}{self.name}.bias", (out_features,), (slice(None),), self.bias
            )
