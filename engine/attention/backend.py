"""The attention backend interface and its registry.

A backend owns the way attention reads the paged KV pool. Per step the runner
calls ``prepare(meta)`` once (index tensors, or FlashInfer's ``plan()``), then
every layer calls ``forward(layer, q, k, v)``, which stores the new K/V at
``meta.out_slots`` and attends each row to its own sequence: causally within a
prefill chunk, and to every earlier position already in the pool (prefix-cache
hits, earlier chunks, decode context).

Backends that can run inside a CUDA graph (``supports_graphs``) also implement
the capture hooks: ``init_graphs`` allocates the fixed buffers once per row
width (1: decode steps; ``1 + K``: verify steps, every sequence an extend of
that many rows), and ``prepare_graph(bs, meta, out_slots, width)`` points
``forward`` at the buffers of batch size ``bs`` and plans them for ``meta``
(padded to ``bs`` sequences), before a capture and before every replay.
``plan`` work stays outside the graph; only ``forward`` is captured.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from typing import ClassVar

import torch

from engine.attention.metadata import AttentionMetadata
from engine.kvcache.pool import KVPool


class AttentionBackend(ABC):
    name: ClassVar[str] = ""
    supports_graphs: ClassVar[bool] = False

    def __init__(self, pool: KVPool, num_q_heads: int, scale: float) -> None:
        self.pool = pool
        self.num_q_heads = num_q_heads
        self.scale = scale

    @classmethod
    def unsupported(cls, device_type: str, dtype: torch.dtype, head_dim: int) -> str | None:
        """Why this backend cannot run the model (None when it can)."""
        return None

    @abstractmethod
    def prepare(self, meta: AttentionMetadata) -> None:
        """Build per-step state shared by all layers."""

    @abstractmethod
    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Write ``k``/``v`` (``[T, kv_heads, D]``) to the pool, return ``[T, q_heads, D]``.

        ``q``, ``k``, ``v`` and the pool share one dtype.
        """

    def kv_store(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """``(k_flat, v_flat, out_slots)`` of ``layer`` for a model that writes the step's
        K/V itself (then it calls ``attend``, not ``forward``); None if the backend writes them.

        ``k_flat``/``v_flat`` are the pool's ``[slots, kv_heads, D]`` views (``KVPool.flat``).
        """
        return None

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """``forward`` for a step whose K/V the model already stored at ``kv_store``'s slots."""
        raise NotImplementedError(f"the {self.name} backend writes K/V itself (kv_store)")

    def init_graphs(self, batch_sizes: list[int], max_pages: int, width: int) -> None:
        raise NotImplementedError(f"the {self.name} backend does not run in CUDA graphs")

    def prepare_graph(
        self, bs: int, meta: AttentionMetadata, out_slots: torch.Tensor, width: int
    ) -> None:
        raise NotImplementedError(f"the {self.name} backend does not run in CUDA graphs")

    def graph_batch_limit(self, width: int) -> int:
        """The most sequences a graph of ``width`` rows a sequence may be captured for."""
        return 1 << 30

    def graph_fits(self, meta: AttentionMetadata, bs: int) -> bool:
        """Whether the step ``meta`` may replay the graph captured for ``bs`` sequences (else
        it runs eagerly)."""
        return True


ATTENTION_BACKENDS: dict[str, type[AttentionBackend]] = {}


def register_backend(cls: type[AttentionBackend]) -> type[AttentionBackend]:
    """Class decorator: make a backend available under ``cls.name``."""
    ATTENTION_BACKENDS[cls.name] = cls
    return cls


def get_backend(
    name: str, device_type: str, dtype: torch.dtype, head_dim: int
) -> type[AttentionBackend]:
    """The backend class for ``name`` (``auto``: ``resolve_name``), checked against the model."""
    name = resolve_name(name, device_type, dtype, head_dim)
    if name not in ATTENTION_BACKENDS:
        hint = (
            " (it needs the flashinfer package and a CUDA device)" if name == "flashinfer" else ""
        )
        raise ValueError(
            f"unknown attention backend {name!r}{hint}; available: {sorted(ATTENTION_BACKENDS)}"
        )
    backend = ATTENTION_BACKENDS[name]
    reason = backend.unsupported(device_type, dtype, head_dim)
    if reason:
        raise ValueError(f"the {name} attention backend cannot run this model: {reason}")
    return backend


def resolve_name(name: str, device_type: str, dtype: torch.dtype, head_dim: int) -> str:
    """``auto`` is ``flashinfer`` where it is installed and supports the model, else ``torch``."""
    if name != "auto":
        return name
    flashinfer = ATTENTION_BACKENDS.get("flashinfer")
    if flashinfer is not None and not flashinfer.unsupported(device_type, dtype, head_dim):
        return "flashinfer"
    return "torch"


def flashinfer_pdl() -> bool:
    """Whether FlashInfer launches its kernels with programmatic dependent launch (Hopper).

    On by default; ``SERVELAB_FLASHINFER_PDL=0`` turns it off (to compare).
    """
    return os.environ.get("SERVELAB_FLASHINFER_PDL", "1") != "0"
