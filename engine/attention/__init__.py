"""Attention backends over the paged KV pool, chosen by name (``--attention-backend``)."""

from engine.attention import torch_backend as _torch_backend  # noqa: F401  (registers "torch")
from engine.attention.backend import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    get_backend,
    register_backend,
)
from engine.attention.batch import ForwardBatch, SeqSpan

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "ForwardBatch",
    "SeqSpan",
    "get_backend",
    "register_backend",
]
