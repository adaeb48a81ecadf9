"""A host-time fix for FlashInfer's ``plan()``: the longest sequence taken on the tensor.

FlashInfer 0.2's batch wrappers find the longest query and KV length of a step
with Python's builtin ``max`` over a host tensor (``max(kv_lens).item()``),
which iterates the tensor one 0-d tensor at a time: about 3 us per sequence,
~0.8 ms of host time per plan at batch 256, paid every step. Binding ``max`` in
those modules to one that reduces a tensor with ``Tensor.max()`` gives the same
value; every other call (lists, several arguments) goes to the builtin.

On by default with FlashInfer; ``SERVELAB_FLASHINFER_FAST_MAX=0`` leaves
FlashInfer as it is (to compare).
"""

from __future__ import annotations

import builtins
import os
from types import ModuleType
from typing import Any

import torch


def tensor_max(*args: Any, **kwargs: Any) -> Any:
    """``max``; one tensor argument is reduced on the tensor (a 0-d tensor, like the builtin)."""
    if len(args) == 1 and not kwargs and isinstance(args[0], torch.Tensor):
        if args[0].numel() == 0:
            raise ValueError("max() arg is an empty sequence")
        return args[0].max()
    return builtins.max(*args, **kwargs)


def fast_plan_max() -> bool:
    """Whether ``install`` binds ``tensor_max``: yes unless ``SERVELAB_FLASHINFER_FAST_MAX=0``."""
    return os.environ.get("SERVELAB_FLASHINFER_FAST_MAX", "1") != "0"


def install(modules: list[ModuleType]) -> bool:
    """Bind ``max`` in FlashInfer's wrapper ``modules`` to ``tensor_max``; when turned off,
    take back a binding made earlier in the process. Returns whether ``max`` is bound."""
    on = fast_plan_max()
    for module in modules:
        if on:
            module.max = tensor_max  # type: ignore[attr-defined]
        elif getattr(module, "max", None) is tensor_max:
            del module.max
    return on
