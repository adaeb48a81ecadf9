"""The configuration every process of one ``engine serve`` reads, and its socket addresses."""

from __future__ import annotations

from pathlib import Path

import msgspec

from core.router import RouterConfig
from core.scheduler import SchedulerConfig

MAX_REQUEST_BYTES = 8 * 2**20  # an escaped 128k-token prompt fits with room to spare


class SocketAddr:
    """``cfg.NAME_addr``: the address of the socket ``NAME`` of a ``ServeConfig``."""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.name = attr.removesuffix("_addr")

    def __get__(self, cfg: ServeConfig, owner: type | None = None) -> str:
        return cfg.addr(self.name)


class ServeConfig(msgspec.Struct, kw_only=True):
    """Everything the children need, written as JSON into the run directory.

        ``model`` is the name clients use; ``model_path`` is the HF folder it
        resolved to, or a preset name (dummy weights). ``tokenizer_path`` is the HF
        folder of the tokenizer, chat template and ``eos_token_ids``; ``vocab_size``
        the model's vocabulary, of which sampling draws only the first
        ``vocab_limit`` ids (None: all). ``max_model_len`` bounds prompt plus output
        tokens. ``max_queued`` bounds the requests waiting for their first token
        (None: unbounded), ``request_timeout`` the seconds a request may take
        (None: no limit), ``drain_timeout`` the seconds SIGTERM lets open requests
        finish (0: stop at once). A request body over ``max_request_bytes`` is a 413.
    With ``gc_freeze`` every process freezes its heap once it is ready
    (``engine.ipc.heap``). With ``record_steps`` (an absolute path) scheduler
    rank 0 writes the step record there (``schema.steprecord``; each replica's to
    ``replica_record_path(record_steps, replica, dp_size)``). ``hardware``
    is what scheduler rank 0 runs on (``engine.runner.hardware``, the words of a
    profile's header), set in the frontend once the ranks are ready.

    ``dp_size`` replicas (each its scheduler ranks and detokenizer) serve behind
    the one frontend, which places every request with a ``router`` core; a
    replica's processes read the config with ``replica`` set to theirs (the
    frontend and the tokenizer workers, shared by all, read replica 0's).
    ``gpu_share`` is how many replicas share each of this replica's GPUs: each
    then takes that share of ``mem_fraction`` of a GPU's memory.
    """

    model: str
    model_path: str
    tokenizer_path: str
    vocab_size: int
    run_dir: str
    parent_pid: int
    max_model_len: int
    eos_token_ids: list[int] = msgspec.field(default_factory=list)
    vocab_limit: int | None = None
    device: str = "cpu"
    dtype: str = "auto"
    tp_size: int = 1
    dp_size: int = 1
    replica: int = 0
    router: RouterConfig = msgspec.field(default_factory=RouterConfig)
    gpu_share: int = 1
    num_tokenizers: int = 1
    host: str = "127.0.0.1"
    port: int = 8000
    dummy_weights: bool = False
    api_key: str | None = None
    max_queued: int | None = None
    request_timeout: float | None = None
    drain_timeout: float = 20.0
    max_request_bytes: int = MAX_REQUEST_BYTES
    scheduler: SchedulerConfig = msgspec.field(default_factory=SchedulerConfig)
    attention_backend: str = "auto"
    cuda_graph: bool = True
    overlap: bool | None = None  # None: on for CUDA, off for CPU
    cpu_threads: int | None = None
    seed: int = 0
    dist_init: str = ""
    log_level: str = "info"
    gc_freeze: bool = True  # freeze each process's start-up heap (engine.ipc.heap)
    record_steps: str | None = None
    hardware: str = ""

    @property
    def overlap_on(self) -> bool:
        """Whether the scheduler overlaps its work with the model's: ``overlap``, else CUDA."""
        return self.device.startswith("cuda") if self.overlap is None else self.overlap

    def addr(self, name: str) -> str:
        """The ``ipc://`` address of the socket ``name`` inside the run directory."""
        return f"ipc://{Path(self.run_dir) / name}.sock"

    def tokenizer_addr(self, index: int) -> str:
        return self.addr(f"tokenizer{index}")

    def scheduler_addr_of(self, replica: int) -> str:
        """The inbox of ``replica``'s scheduler rank 0."""
        return self.addr(f"scheduler{replica}")

    @property
    def scheduler_addr(self) -> str:
        return self.scheduler_addr_of(self.replica)

    @property
    def detokenizer_addr(self) -> str:
        return self.addr(f"detokenizer{self.replica}")

    frontend_addr = SocketAddr()
    ready_addr = SocketAddr()

    def child_name(self, role: str, rank: int, replica: int | None = None) -> str:
        """How logs and the launcher name a child: ``scheduler0``, and with several replicas
        ``scheduler0.r1`` for a process of replica 1 (default: this config's replica;
        tokenizer workers serve them all)."""
        shared = self.dp_size == 1 or role == "tokenizer"
        r = self.replica if replica is None else replica
        return f"{role}{rank}" if shared else f"{role}{rank}.r{r}"

    def save(self) -> Path:
        """Write this config into the run directory (one file per replica); its path."""
        path = Path(self.run_dir) / f"config{self.replica}.json"
        path.write_bytes(msgspec.json.encode(self))
        return path

    @staticmethod
    def load(path: str | Path) -> ServeConfig:
        return msgspec.json.decode(Path(path).read_bytes(), type=ServeConfig)
