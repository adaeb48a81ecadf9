"""Filling a model's parameters: from HF safetensors by name, or with seeded random values.

Both paths produce the full tensor of a parameter (or read just the needed slice
from the file) and cut this rank's shard, so a dummy model with a given seed has
the same weights at every tensor-parallel degree.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.layers import Shard
from engine.models.llama import LlamaForCausalLM

DUMMY_STD = 0.02


def _cut(full_shape: tuple[int, ...], shard: Shard | None) -> tuple[slice, ...]:
    index = [slice(None)] * len(full_shape)
    if shard is not None:
        dim, start, size = shard
        index[dim] = slice(start, start + size)
    return tuple(index)


def load_safetensors(model: LlamaForCausalLM, folder: str | Path) -> None:
    """Copy every parameter's shard from the ``*.safetensors`` files of ``folder``."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    shards = model.parameter_shards()
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open has no __iter__)
                if name not in params:
                    continue
                tensor_slice = f.get_slice(name)
                full_shape = tuple(tensor_slice.get_shape())
                data = tensor_slice[_cut(full_shape, shards[name])]
                param = params[name]
                if tuple(data.shape) != tuple(param.shape):
                    raise ValueError(
                        f"{file.name}: {name} has shape {tuple(data.shape)} on this rank, "
                        f"the model expects {tuple(param.shape)}"
                    )
                param.data.copy_(data.to(param.dtype))
                loaded.add(name)
    missing = sorted(set(params) - loaded)
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {len(missing)} parameters: {missing[:5]}")


def init_dummy(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded random weights of the real shapes: normals of std 0.02, norm weights of 1.

    Each parameter draws from its own generator (seed, name), full-size, then
    keeps this rank's slice: the same seed gives the same weights at every TP
    degree on one device type (CPU and CUDA generators differ).
    """
    shards = model.parameter_shards()
    for name, param in model.named_parameters():
        if name.endswith("norm.weight"):
            param.data.fill_(1.0)
            continue
        full_shape = list(param.shape)
        shard = shards[name]
        if shard is not None:
            dim, _, _ = shard
            full_shape[dim] = _full_size(model, name, dim)
        gen = torch.Generator(device=param.device)
        gen.manual_seed(zlib.crc32(f"{seed}:{name}".encode()))  # CPU generators keep 32 bits
        full = torch.randn(full_shape, generator=gen, device=param.device, dtype=torch.float32)
        param.data.copy_(full[_cut(tuple(full_shape), shard)].mul_(DUMMY_STD).to(param.dtype))


def _full_size(model: LlamaForCausalLM, name: str, dim: int) -> int:
    config = model.config
    d = config.head_dim
    if ".mlp." in name:
        return config.intermediate_size
    if "q_proj" in name or "o_proj" in name:
        return config.num_heads * d
    if "k_proj" in name or "v_proj" in name:
        return config.num_kv_heads * d
    raise ValueError(f"no full size known for sharded parameter {name} (dim {dim})")
