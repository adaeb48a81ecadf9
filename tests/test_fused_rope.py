"""The fused QK-norm + rotary + KV-store kernel against a float64 reference.

Runs on CUDA where Triton is installed, else on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1``, set before the kernel's module is first imported); skipped
without Triton. Inputs are fresh random values, the pool is poisoned with NaN
first, and every slot the kernel must not touch must still hold NaN afterwards.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttention
from engine.kvcache.pool import KVPool
from engine.models.llama import LlamaForCausalLM
from engine.models.loader import init_dummy
from engine.models.ops import FusedOps, TorchOps
from engine.models.rotary import cos_sin_cache
from schema.models import RopeScaling, get_preset

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module")
def fused() -> ModuleType:
    if DEVICE == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
    return importlib.import_module("engine.models.fused_rope")


def reference(
    qkv: torch.Tensor,
    nq: int,
    nkv: int,
    d: int,
    positions: torch.Tensor,
    cos_sin: torch.Tensor,
    weights: tuple[torch.Tensor, torch.Tensor] | None,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = qkv.double()
    q = x[:, : nq * d].view(-1, nq, d)
    k = x[:, nq * d : (nq + nkv) * d].view(-1, nkv, d)
    v = x[:, (nq + nkv) * d :].view(-1, nkv, d)
    if weights is not None:
        q = q * torch.rsqrt(q.pow(2).mean(-1, keepdim=True) + eps) * weights[0].double()
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * weights[1].double()
    rows = cos_sin.double()[positions]
    half = d // 2
    cos = rows[:, None, :half].repeat(1, 1, 2)
    sin = rows[:, None, half:].repeat(1, 1, 2)

    def rotate(y: torch.Tensor) -> torch.Tensor:
        return y * cos + torch.cat((-y[..., half:], y[..., :half]), -1) * sin

    return rotate(q), rotate(k), v


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b).norm() / b.norm())


@pytest.mark.parametrize(
    ("tokens", "nq", "nkv", "d", "norm", "dtype"),
    [
        (1, 32, 8, 128, False, torch.float32),
        (5, 16, 8, 128, True, torch.float32),
        (7, 6, 2, 64, True, torch.bfloat16),
        (3, 4, 4, 256, False, torch.bfloat16),
    ],
)
def test_fused_rope_store_matches_reference(
    fused: ModuleType, tokens: int, nq: int, nkv: int, d: int, norm: bool, dtype: torch.dtype
) -> None:
    g = torch.Generator().manual_seed(tokens * 1000 + nq)
    width = (nq + 2 * nkv) * d
    # the matmul output inside a wider buffer: rows strided, unit stride along a row
    buf = torch.randn(tokens, width + 64, generator=g).to(dtype)
    qkv = buf[:, :width]
    before = qkv.clone()
    positions = torch.randint(0, 4000, (tokens,), generator=g)
    cos_sin = cos_sin_cache(d, 500000.0, RopeScaling("llama3", 8.0, 1.0, 4.0, 8192), 4096, "cpu")
    weights = (
        (torch.rand(d, generator=g).to(dtype) + 0.5, torch.rand(d, generator=g).to(dtype) + 0.5)
        if norm
        else None
    )
    num_slots = 4 * tokens + 8
    slots = torch.randperm(num_slots, generator=g)[:tokens]
    k_cache = torch.full((num_slots, nkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full((num_slots, nkv, d), float("nan"), dtype=dtype)
    dev = torch.device(DEVICE)
    qkv_d, k_d, v_d = qkv.to(dev), k_cache.to(dev), v_cache.to(dev)
    if DEVICE == "cuda":
        qkv_d = buf.to(dev)[:, :width]
    q = fused.qkv_rope_store(
        qkv_d,
        nq,
        nkv,
        d,
        positions.to(dev),
        cos_sin.to(dev),
        slots.to(dev),
        k_d,
        v_d,
        *(w.to(dev) for w in weights or ()),
        eps=1e-6,
    )
    q_ref, k_ref, v_ref = reference(before, nq, nkv, d, positions, cos_sin, weights, 1e-6)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert q.shape == (tokens, nq, d) and q.data_ptr() == qkv_d.data_ptr()
    assert rel(q.cpu(), q_ref) < tol
    assert rel(k_d.cpu()[slots], k_ref) < tol
    assert torch.equal(v_d.cpu()[slots], v_ref.to(dtype))
    untouched = torch.ones(num_slots, dtype=torch.bool)
    untouched[slots] = False
    assert k_d.cpu()[untouched].isnan().all() and v_d.cpu()[untouched].isnan().all()
    # K and V columns of the QKV rows are left as they were
    assert torch.equal(qkv_d.cpu()[:, nq * d :], before[:, nq * d :])


class _StoredTorchAttention(TorchAttention):
    """The torch backend with the K/V write left to the model (as FlashInfer's with FusedOps)."""

    def kv_store(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        k_flat, v_flat = self.pool.flat(layer)
        return k_flat, v_flat, self.out_slots

    def attend(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        k_flat, v_flat = self.pool.flat(layer)
        return self.forward(layer, q, k_flat[self.out_slots], v_flat[self.out_slots])


def _cpu_fused_ops(module: ModuleType) -> TorchOps:
    """``FusedOps`` with the torch kernels for everything but ``qkv_rope_store``."""

    class CpuFused(FusedOps):
        rms_norm = TorchOps.rms_norm
        add_rms_norm = TorchOps.add_rms_norm
        silu_and_mul = TorchOps.silu_and_mul
        rotary = TorchOps.rotary

        def __init__(self) -> None:
            self._fused = module

    return CpuFused()


def _meta(start: int, length: int, pages: tuple[int, ...], page: int) -> AttentionMetadata:
    """One sequence with ``start`` cached positions and ``length`` new rows."""
    total = start + length
    positions = torch.arange(start, total)
    table = torch.tensor(pages)
    return AttentionMetadata(
        num_prefill=0 if length == 1 and start > 0 else 1,
        qo_indptr=torch.tensor([0, length], dtype=torch.int32),
        kv_indptr=torch.tensor([0, len(pages)], dtype=torch.int32),
        kv_lens=torch.tensor([total], dtype=torch.int32),
        last_page_len=torch.tensor([(total - 1) % page + 1], dtype=torch.int32),
        kv_indices=table.to(torch.int32),
        out_slots=table[positions // page] * page + positions % page,
        page_size=page,
    )


@pytest.mark.skipif(DEVICE != "cpu", reason="the GPU tests cover the CUDA path")
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-qwen3"])
def test_model_with_fused_kernel_matches_torch_ops(fused: ModuleType, preset: str) -> None:
    """A prefill then two decode steps: the fused layer path gives the same hidden states."""
    config = get_preset(preset)
    page, pages = 4, (3, 0, 5, 1)
    outs = []
    for ops, backend in (
        (TorchOps(), TorchAttention),
        (_cpu_fused_ops(fused), _StoredTorchAttention),
    ):
        model = LlamaForCausalLM(config, ops=ops)
        init_dummy(model, seed=1)
        pool = KVPool(
            config.num_layers,
            8,
            page,
            config.num_kv_heads,
            config.head_dim,
            torch.float32,
            torch.device("cpu"),
        )
        attn = backend(pool, config.num_heads, config.head_dim**-0.5)
        ids = torch.randint(0, config.vocab_size, (14,), generator=torch.Generator().manual_seed(2))
        hidden = []
        with torch.inference_mode():
            for start, length in ((0, 12), (12, 1), (13, 1)):
                attn.prepare(_meta(start, length, pages, page))
                rows = ids[start : start + length]
                hidden.append(model(rows, torch.arange(start, start + length), attn))
        outs.append(torch.cat(hidden))
    assert rel(outs[1], outs[0].double()) < 1e-5
