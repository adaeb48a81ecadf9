"""The runner's configuration (the same on every tensor-parallel rank): its settings, declared
once with their defaults and help, and the values the launcher fills in.

``engine serve`` builds one flag per setting (``core.settings``) and nests this
object in the config every process reads (``engine.ipc.config.ServeConfig``);
the scheduler process builds its runner from it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.scheduler import SchedulerConfig
from core.settings import derived, mem_fraction_setting, positive_float, positive_int, setting

if TYPE_CHECKING:
    import torch

DTYPE_NAMES = ("float32", "bfloat16", "float16")


@dataclass
class RunnerArgs:
    """``model``: a known model name, an HF folder, or (with ``dummy_weights``) a preset name.

    ``scheduler`` is the configuration of the core this runner serves: the runner
    builds the KV pool it describes (``num_pages`` pages of ``page_size``
    tokens, a request table and CUDA graphs for ``max_running`` requests, the
    host KV tier under the prefix cache) and sizes what it leaves out, once
    (``ModelRunner.sized_scheduler``). ``num_pages`` None sizes the pool from
    ``mem_fraction`` of GPU memory (after weights) or, on CPU, from
    ``cpu_kv_cache_gb`` (at most ``cpu_max_kv_tokens`` tokens); with several
    ranks the smallest count wins. ``gpu_share`` > 1 replicas sharing a GPU each
    take ``mem_fraction / gpu_share`` of its memory for what they allocate
    (weights and KV pool), whatever the others hold. ``dist_init`` is the
    ``torch.distributed`` rendezvous (``tcp://127.0.0.1:PORT`` or ``file://...``),
    needed when ``tp_size > 1``. ``cpu_threads`` > 0 sets torch's intra-op threads.
    ``vocab_limit`` restricts sampling to the first ids (those a borrowed tokenizer
    can decode); the LM head still computes the whole vocabulary.
    ``attention_backend`` ``auto`` is FlashInfer on CUDA (torch when FlashInfer is
    not installed) and torch on CPU. ``cuda_graph`` captures decode steps (and, with
    ``num_draft_tokens`` K > 0, verify steps of 1 + K rows a slot) as CUDA graphs at start-up
    (ignored on CPU), for batches up to ``max_running`` (at most 256).
    """

    model: str = field(metadata={"derived": "the HF folder or preset --model resolves to"})
    device: str = setting("cpu", "where the model runs", choices=("cpu", "cuda"))
    dtype: str = setting(
        "auto", "weights and KV dtype; auto: float32 on CPU, bfloat16 on CUDA",
        choices=("auto", *DTYPE_NAMES),
    )  # fmt: skip
    tp_size: int = setting(1, "tensor-parallel degree", flag="--tp", parse=positive_int)
    attention_backend: str = setting(
        "auto",
        "auto: flashinfer on CUDA when installed, torch otherwise",
        choices=("auto", "torch", "flashinfer"),
    )
    cuda_graph: bool = setting(
        True, "capture decode and verify steps as CUDA graphs (CUDA); --no-cuda-graph: eager"
    )
    dummy_weights: bool = setting(False, "random weights, real shapes")
    seed: int = setting(0, "seed of the dummy weights and of sampling")
    mem_fraction: float = mem_fraction_setting()
    cpu_kv_cache_gb: float = setting(
        1.0, "CPU: GiB the KV pool may take when --num-pages is left out", parse=positive_float
    )
    cpu_max_kv_tokens: int = setting(
        65536, "CPU: most tokens the KV pool holds when --num-pages is left out", parse=positive_int
    )
    cpu_threads: int = setting(
        0, "torch threads per rank; 0: torch's own count", parse=positive_int
    )
    scheduler: SchedulerConfig = field(
        default_factory=SchedulerConfig, metadata={"derived": "the core's settings (own flags)"}
    )
    vocab_limit: int | None = derived(None, "the ids the tokenizer can decode (a borrowed one)")
    dist_init: str = derived("", "each replica's rendezvous, picked at launch")
    gpu_share: int = derived(1, "replicas per GPU: --dp with --dp-share-gpu")

    def torch_dtype(self) -> torch.dtype:
        import torch

        if self.dtype == "auto":
            return torch.bfloat16 if self.device.startswith("cuda") else torch.float32
        if self.dtype not in DTYPE_NAMES:
            raise ValueError(
                f"unknown dtype {self.dtype!r}; choose auto or one of {sorted(DTYPE_NAMES)}"
            )
        dtype: torch.dtype = getattr(torch, self.dtype)
        return dtype

    def validate(self) -> RunnerArgs:
        """Raise ``ValueError`` on inconsistent arguments; return self."""
        self.torch_dtype()
        if self.tp_size < 1:
            raise ValueError(f"tp_size must be >= 1, got {self.tp_size}")
        if self.tp_size > 1 and not self.dist_init:
            raise ValueError("tp_size > 1 needs dist_init (tcp://HOST:PORT or file://PATH)")
        if not self.device.startswith(("cpu", "cuda")):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        if self.gpu_share < 1:
            raise ValueError(f"gpu_share must be >= 1, got {self.gpu_share}")
        if not 0.0 < self.mem_fraction <= 1.0:
            raise ValueError(f"mem_fraction must be in (0, 1], got {self.mem_fraction}")
        return self
