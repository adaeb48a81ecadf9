"""Rotary position embedding (HF ``rotate_half`` layout), with Llama 3.1 frequency scaling."""

from __future__ import annotations

import math

import torch

from engine.models.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> torch.Tensor:
    """Per-pair rotation frequencies, float32, shape ``[head_dim // 2]``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (theta**exponents)
    if scaling.rope_type == "default":
        return inv_freq
    if scaling.rope_type != "llama3":
        raise ValueError(f"unsupported rope scaling type {scaling.rope_type!r}")
    old_len = scaling.original_max_position_embeddings
    low_wavelen = old_len / scaling.low_freq_factor
    high_wavelen = old_len / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / scaling.factor, inv_freq)
    smooth = (old_len / wavelen - scaling.low_freq_factor) / (
        scaling.high_freq_factor - scaling.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


class Rotary:
    """Computes ``cos``/``sin`` for a step's positions once; layers apply them to q and k."""

    def __init__(
        self, head_dim: int, theta: float, scaling: RopeScaling, device: torch.device
    ) -> None:
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling).to(device)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
        """``(cos, sin)`` of shape ``[T, 1, head_dim]`` for positions ``[T]``."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype)[:, None, :], emb.sin().to(dtype)[:, None, :]


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` of shape ``[T, heads, head_dim]``."""
    return x * cos + _rotate_half(x) * sin
