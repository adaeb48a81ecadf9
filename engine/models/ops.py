"""The elementwise kernels of a Llama-family layer, behind one small interface.

``TorchOps`` is plain PyTorch (CPU, and the reference on CUDA); ``FlashInferOps``
uses FlashInfer's fused kernels on CUDA (one launch each for add + RMSNorm,
SiLU-and-multiply and rotary), which matters inside a CUDA graph where a decode
step is a chain of a few hundred small kernels. Both compute the same functions:

    rms_norm(x, w)            = w * x / sqrt(mean(x^2) + eps)      (float32 inside)
    add_rms_norm(x, r, w)     = (rms_norm(x + r, w), x + r)
    silu_and_mul([g | u])     = silu(g) * u
    rotary(pos, q, k, cache)  = q and k rotated in the ``rotate_half`` layout, with
                                cache[p] = [cos(p f_0..f_{d/2-1}) | sin(p f_0..f_{d/2-1})]

``FusedOps`` (the default with FlashInfer on CUDA; ``SERVELAB_FUSED_ROPE_STORE=0`` turns
it off) adds ``qkv_rope_store``: QK-norm, rotary and the KV write of a layer in one Triton
kernel (``engine.models.fused_rope``), used where the attention backend hands out its KV
store (``AttentionBackend.kv_store``). Measured on an H200 (``reports/gpu_speed/``):
the decode step's device time 2.9 % shorter for the Llama-3.1-8B shape at batch 1 and 13.8 %
for Qwen3-0.6B, prefill unchanged.
"""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.nn.functional as F

from engine.attention.backend import flashinfer_pdl


class TorchOps:
    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return weight * h.to(dtype)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        residual = residual + x
        return self.rms_norm(residual, weight, eps), residual

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return F.silu(x[..., :half]) * x[..., half:]

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` ``[T, Hq, D]`` and ``k`` ``[T, Hk, D]`` rotated; may reuse their storage."""
        half = q.shape[-1] // 2
        rows = cos_sin.index_select(0, positions)
        cos = rows[:, :half].repeat(1, 2).to(q.dtype)[:, None, :]
        sin = rows[:, half:].repeat(1, 2).to(q.dtype)[:, None, :]
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class FlashInferOps(TorchOps):
    """FlashInfer's fused norm, activation and rotary kernels (CUDA, half precision)."""

    name = "flashinfer"

    def __init__(self) -> None:
        import flashinfer

        self.fi = flashinfer
        self.pdl = flashinfer_pdl()

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        shape = x.shape
        out: torch.Tensor = self.fi.norm.rmsnorm(
            x.reshape(-1, shape[-1]), weight, eps, enable_pdl=self.pdl
        )
        return out.view(shape)

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        self.fi.norm.fused_add_rmsnorm(x, residual, weight, eps, enable_pdl=self.pdl)
        return x, residual

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fi.activation.silu_and_mul(x, enable_pdl=self.pdl)
        return out

    def rotary(
        self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # in place; q and k may be strided views of the fused QKV output (last dim contiguous)
        self.fi.rope.apply_rope_with_cos_sin_cache_inplace(
            positions, q.view(q.shape[0], -1), k.view(k.shape[0], -1), q.shape[-1], cos_sin, True
        )
        return q, k


def fused_rope_store() -> bool:
    """Whether layers fuse QK-norm, rotary and the KV write: yes unless
    ``SERVELAB_FUSED_ROPE_STORE=0`` (or Triton is missing)."""
    if os.environ.get("SERVELAB_FUSED_ROPE_STORE", "1") == "0":
        return False
    return importlib.util.find_spec("triton") is not None


class FusedOps(FlashInferOps):
    """FlashInfer's kernels, and one Triton kernel from the QKV matmul's output to attention."""

    name = "flashinfer+fused"

    def __init__(self) -> None:
        super().__init__()
        from engine.models import fused_rope

        self._fused = fused_rope

    def qkv_rope_store(
        self,
        qkv: torch.Tensor,
        heads: tuple[int, int, int],
        positions: torch.Tensor,
        cos_sin: torch.Tensor,
        store: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        norms: tuple[torch.Tensor, torch.Tensor, float] | None,
    ) -> torch.Tensor:
        """Q ``[T, Hq, D]`` (a view of ``qkv``), normed and rotated; K and V stored.

        ``heads`` is ``(Hq, Hkv, D)``, ``store`` the backend's ``(k_flat, v_flat,
        slots)``, ``norms`` the QK-norm weights and epsilon (None without QK-norm).
        """
        q_weight, k_weight, eps = norms if norms is not None else (None, None, 0.0)
        k_flat, v_flat, slots = store
        out: torch.Tensor = self._fused.qkv_rope_store(
            qkv, *heads, positions, cos_sin, slots, k_flat, v_flat, q_weight, k_weight, eps
        )
        return out


def get_ops(device: torch.device, dtype: torch.dtype, backend: str) -> TorchOps:
    """FlashInfer kernels where the attention backend is FlashInfer (CUDA, half precision),
    with the fused rotary + KV-write kernel when ``fused_rope_store()``."""
    if backend == "flashinfer" and device.type == "cuda" and dtype != torch.float32:
        return FusedOps() if fused_rope_store() else FlashInferOps()
    return TorchOps()
