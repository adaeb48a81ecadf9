"""Filling a model's parameters: from HF safetensors by name, or with seeded random values.

Both paths go through ``LlamaForCausalLM.checkpoint_tensors()``: each checkpoint
tensor's slice for this rank is read from the file (or drawn full-size and cut),
then copied into its place, a packed weight's rows included. So a dummy model with
a given seed has the same weights at every tensor-parallel degree.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import torch
from safetensors import safe_open

from engine.models.llama import LlamaForCausalLM

DUMMY_STD = 0.02


def load_safetensors(model: LlamaForCausalLM, folder: str | Path) -> None:
    """Copy every checkpoint tensor's slice from the ``*.safetensors`` files of ``folder``."""
    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {folder}")
    wanted = {t.name: t for t in model.checkpoint_tensors()}
    loaded: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118  (safe_open has no __iter__)
                spec = wanted.get(name)
                if spec is None:
                    continue
                data = f.get_slice(name)[spec.index]
                if tuple(data.shape) != tuple(spec.target.shape):
                    raise ValueError(
                        f"{file.name}: {name} has shape {tuple(data.shape)} on this rank, "
                        f"the model expects {tuple(spec.target.shape)}"
                    )
                spec.target.copy_(data.to(spec.target.dtype))
                loaded.add(name)
    missing = sorted(set(wanted) - loaded)
    if missing:
        raise ValueError(f"checkpoint in {folder} lacks {len(missing)} tensors: {missing[:5]}")


@torch.no_grad()
def init_dummy(model: LlamaForCausalLM, seed: int) -> None:
    """Seeded random weights of the real shapes: normals of std 0.02, norm weights of 1.

    Each checkpoint tensor draws from its own generator (seed, name), full-size, then
    keeps this rank's slice: the same seed gives the same weights at every TP degree
    on one device type (CPU and CUDA generators differ).
    """
    for spec in model.checkpoint_tensors():
        target = spec.target
        if spec.name.endswith("norm.weight"):
            target.fill_(1.0)
            continue
        gen = torch.Generator(device=target.device)
        gen.manual_seed(zlib.crc32(f"{seed}:{spec.name}".encode()))  # CPU generators keep 32 bits
        full = torch.randn(spec.full_shape, generator=gen, device=target.device)
        target.copy_(full[spec.index].mul_(DUMMY_STD).to(target.dtype))
