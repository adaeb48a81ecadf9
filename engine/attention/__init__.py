"""Attention backends over the paged KV pool, chosen by name (``--attention-backend``).

``torch`` is always registered; ``flashinfer`` is registered when the package
imports (a CUDA machine with FlashInfer installed).
"""

import importlib.util

from engine.attention import torch_backend as _torch_backend  # noqa: F401  (registers "torch")
from engine.attention.backend import (
    ATTENTION_BACKENDS,
    AttentionBackend,
    get_backend,
    register_backend,
    resolve_name,
)
from engine.attention.metadata import AttentionMetadata

if importlib.util.find_spec("flashinfer") is not None:
    from engine.attention import flashinfer_backend as _flashinfer_backend  # noqa: F401

__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionBackend",
    "AttentionMetadata",
    "get_backend",
    "register_backend",
    "resolve_name",
]
