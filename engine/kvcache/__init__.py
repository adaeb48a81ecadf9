"""The paged KV cache: per-layer K and V tensors addressed by (page, slot)."""

from engine.kvcache.pool import KVPool

__all__ = ["KVPool"]
