"""Arguments that build a model runner (the same on every tensor-parallel rank)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


@dataclass
class RunnerArgs:
    """``model``: a known model name, an HF folder, or (with ``dummy_weights``) a preset name.

    ``dtype`` ``auto`` is float32 on CPU and bfloat16 on CUDA. ``num_pages`` None
    sizes the KV pool from ``mem_fraction`` of GPU memory (after weights) or, on
    CPU, from ``cpu_kv_cache_gb`` (at most ``cpu_max_kv_tokens`` tokens); with
    several ranks the smallest count wins. ``gpu_share`` > 1 replicas sharing a GPU each
    take ``mem_fraction / gpu_share`` of its memory for what they allocate (weights and KV
    pool), whatever the others hold. ``dist_init`` is the
    ``torch.distributed`` rendezvous (``tcp://127.0.0.1:PORT`` or ``file://...``),
    needed when ``tp_size > 1``. ``cpu_threads`` > 0 sets torch's intra-op threads.
    ``vocab_limit`` restricts sampling to the first ids (those a borrowed tokenizer
    can decode); the LM head still computes the whole vocabulary.
    ``attention_backend`` ``auto`` is FlashInfer on CUDA (torch when FlashInfer is
    not installed) and torch on CPU. ``cuda_graph`` captures decode steps as CUDA
    graphs at start-up (ignored on CPU), for batches up to ``max_running`` (at most 256);
    ``max_running`` also sizes the table of per-request page tables.
    ``host_kv_pages`` (or, when 0, ``host_kv_gb`` of this rank's pages) sizes the
    host KV tier's pool (``engine.kvcache.host_pool``); 0 and 0: none.
    """

    model: str
    device: str = "cpu"
    dtype: str = "auto"
    tp_size: int = 1
    num_pages: int | None = None
    page_size: int = 16
    attention_backend: str = "auto"
    cuda_graph: bool = True
    max_running: int = 256
    dummy_weights: bool = False
    seed: int = 0
    dist_init: str = ""
    mem_fraction: float = 0.85
    gpu_share: int = 1
    cpu_kv_cache_gb: float = 1.0
    cpu_max_kv_tokens: int = 65536
    cpu_threads: int = 0
    vocab_limit: int | None = None
    host_kv_gb: float = 0.0
    host_kv_pages: int = 0

    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        try:
            return DTYPES[self.dtype]
        except KeyError:
            raise ValueError(
                f"unknown dtype {self.dtype!r}; choose auto or one of {sorted(DTYPES)}"
            ) from None

    def validate(self) -> RunnerArgs:
        """Raise ``ValueError`` on inconsistent arguments; return self."""
        self.torch_dtype()
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.tp_size > 1 and not self.dist_init:
            raise ValueError("tp_size > 1 needs dist_init (tcp://HOST:PORT or file://PATH)")
        if self.max_running < 1:
            raise ValueError(f"max_running must be >= 1, got {self.max_running}")
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.num_pages is not None and self.num_pages < 1:
            raise ValueError(f"num_pages must be >= 1, got {self.num_pages}")
        if not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.gpu_share < 1:
            raise ValueError(f"gpu_share must be >= 1, got {self.gpu_share}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        return self
