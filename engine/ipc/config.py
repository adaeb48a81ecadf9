"""The configuration every process of one ``engine serve`` reads, and its socket addresses."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

import msgspec

from core.router import RouterConfig
from core.scheduler import SchedulerConfig
from core.settings import derived, non_negative_float, positive_float, positive_int, setting
from engine.runner.args import RunnerArgs
from engine.speculative import SpeculativeConfig
from schema.layouts import LAYOUTS

MAX_REQUEST_BYTES = 8 * 2**20  # an escaped 128k-token prompt fits with room to spare
LOG_LEVELS = ("debug", "info", "warning", "error")

T = TypeVar("T")


class SocketAddr:
    """``cfg.NAME_addr``: the address of the socket ``NAME`` of a ``ServeConfig``."""

    def __set_name__(self, owner: type, attr: str) -> None:
        self.name = attr.removesuffix("_addr")

    def __get__(self, cfg: ServeConfig, owner: type | None = None) -> str:
        return cfg.addr(self.name)


class RunnerSetting(Generic[T]):
    """``cfg.NAME``: a read-only shortcut to ``cfg.runner.NAME`` of a ``ServeConfig``
    (to ``cfg.runner.FIELD`` when made as ``RunnerSetting("FIELD")``)."""

    def __init__(self, runner_name: str = "") -> None:
        self.runner_name = runner_name

    def __set_name__(self, owner: type, attr: str) -> None:
        self.runner_name = self.runner_name or attr

    def __get__(self, cfg: ServeConfig, owner: type | None = None) -> T:
        value: T = getattr(cfg.runner, self.runner_name)
        return value


@dataclass(kw_only=True)
class ServeConfig:
    """Everything the children need, written as JSON into the run directory.

    The fields made with ``setting`` are ``engine serve``'s flags (their help and
    defaults are declared here once, ``core.settings``); ``runner`` holds the
    runner's (``engine.runner.args.RunnerArgs``), which holds the scheduler
    core's, and ``router`` the router core's. The ``derived`` fields are filled
    in at launch:

    ``model`` is the name clients use; ``runner.model`` is the HF folder it
    resolved to, or a preset name (dummy weights). ``tokenizer_path`` is the HF
    folder of the tokenizer, chat template and ``eos_token_ids``; ``vocab_size``
    the model's vocabulary, of which sampling draws only the first
    ``runner.vocab_limit`` ids (None: all). ``max_model_len`` bounds prompt plus
    output tokens. ``max_queued`` bounds the requests waiting for their first
    token (None: unbounded), ``request_timeout`` the seconds a request may take
    (None: no limit), ``drain_timeout`` the seconds SIGTERM lets open requests
    finish (0: stop at once). A request body over ``max_request_bytes`` is a 413.
    With ``gc_freeze`` every process freezes its heap once it is ready
    (``engine.ipc.heap``). With ``record_steps`` (an absolute path) scheduler
    rank 0 writes the step record there (``schema.steprecord``; each replica's to
    ``replica_record_path(record_steps, replica, dp_size)``). ``hardware``
    is what scheduler rank 0 runs on (``engine.runner.hardware``, the words of a
    profile's header), set in the frontend once the ranks are ready.

    ``speculative`` names scheduler rank 0's drafter (``engine.speculative``); the
    core's ``num_draft_tokens`` bounds its drafts.

    With ``scheduler.role`` ``prefill`` or ``decode`` (``--role``) the server is one half of
    a prefill/decode pair (``engine.scheduler_proc.pd``): a decode server's scheduler binds
    its hand-off socket and KV receiver on ``pd_host`` and reports their addresses
    (``handoff_addr``, ``kv_addr``); ``pd_timeout`` bounds every wait of a hand-off;
    ``pd_cuda_ipc`` lets a prefill server on the same GPU hand its pages over through CUDA IPC.

    ``layout`` says which process tokenizes and detokenizes (``engine.launch.launcher``
    spawns the children it needs; ``engine.ipc.messages`` draws each layout's paths).

    ``dp_size`` replicas (each its scheduler ranks and detokenizer) serve behind
    the one frontend, which places every request with a ``router`` core; a
    replica's processes read the config with ``replica`` set to theirs (the
    frontend and the tokenizer workers, shared by all, read replica 0's).
    ``runner.gpu_share`` is how many replicas share each of this replica's GPUs:
    each then takes that share of ``runner.mem_fraction`` of a GPU's memory.
    """

    model: str = setting(help="known model name, HF folder, or (dummy weights) a preset")
    runner: RunnerArgs = field(metadata={"derived": "the runner's settings (their own flags)"})
    tokenizer_path: str = field(metadata={"derived": "--tokenizer or the model's own"})
    vocab_size: int = field(metadata={"derived": "the model's config"})
    run_dir: str = field(metadata={"derived": "a private folder made at launch"})
    parent_pid: int = field(metadata={"derived": "the launching process"})
    max_model_len: int = field(metadata={"derived": "--max-model-len within the model's context"})
    eos_token_ids: list[int] = field(default_factory=list, metadata={"derived": "the tokenizer's"})
    dp_size: int = setting(
        1,
        "data-parallel replicas behind this frontend, each its own scheduler and TP group "
        "(on CUDA its own --tp GPUs); --router picks one for every request",
        flag="--dp",
        parse=positive_int,
    )
    replica: int = derived(0, "each replica's index")
    router: RouterConfig = field(
        default_factory=RouterConfig, metadata={"derived": "the router core's settings"}
    )
    speculative: SpeculativeConfig = field(
        default_factory=SpeculativeConfig,
        metadata={"derived": "the drafter's settings (their own flags)"},
    )
    layout: str = setting(
        "split",
        "where text becomes token ids and back: split (tokenizer worker processes and a "
        "detokenizer process per replica), frontend (threads of the HTTP frontend's process) "
        "or inline (each replica's scheduler rank 0, between its steps); any --dp and --tp",
        choices=LAYOUTS,
    )
    num_tokenizers: int = setting(
        1,
        "tokenizer worker processes (--layout split; above 1 an error otherwise)",
        parse=positive_int,
    )
    host: str = setting("127.0.0.1", "address to listen on")
    port: int = setting(8000, "port to listen on; 0 picks a free port")
    api_key: str | None = setting(None, "require 'Authorization: Bearer KEY'")
    max_queued: int | None = setting(
        None,
        "requests that may wait for their first token; beyond it 429 with Retry-After "
        "(default: unbounded)",
        parse=positive_int,
    )
    request_timeout: float | None = setting(
        None,
        "seconds a request may take before it is aborted with 504 (default: none)",
        parse=positive_float,
    )
    drain_timeout: float = setting(
        20.0,
        "on SIGTERM, seconds open requests may take to finish while new ones get 503 "
        "(0: stop at once)",
        parse=non_negative_float,
    )
    max_request_bytes: int = setting(
        MAX_REQUEST_BYTES,
        "largest request body in bytes; a larger one is refused with 413 before it is parsed",
        parse=positive_int,
    )
    overlap: bool | None = setting(
        None, "launch step N+1 before finishing step N (default: on for CUDA, off for CPU)"
    )
    log_level: str = setting("info", "log level of every process", choices=LOG_LEVELS)
    gc_freeze: bool = setting(
        True,
        "freeze each process's start-up heap out of the garbage collector's scans once it "
        "is ready, so that a full collection does not stall serving",
    )
    record_steps: str | None = setting(
        None,
        "write every step scheduler rank 0 runs to PATH as CSV (the step record: "
        "schema/steprecord.py), in batches and at exit; with --dp N, replica K's to "
        "STEM.replicaK.SUFFIX beside PATH",
        metavar="PATH",
    )
    host_profile: str | None = setting(
        None,
        "sample every process's Python stacks from start to exit and write each one's call "
        "tree to DIR at exit (engine.ipc.host_profile: text, speedscope, pyinstrument)",
        metavar="DIR",
    )
    hardware: str = derived("", "what scheduler rank 0 reports it runs on")
    pd_host: str = setting(
        "127.0.0.1",
        "--role decode: the address its hand-off socket and KV receiver bind (tcp, free ports)",
    )
    pd_timeout: float = setting(
        30.0,
        "--role prefill|decode: seconds each wait of a hand-off may take (the other half of a "
        "request, the decode server's answer, the KV's acknowledgment or landing) before the "
        "request fails",
        parse=positive_float,
    )
    pd_cuda_ipc: bool = setting(
        False,
        "--role decode on a GPU: take the KV of a prefill server on the same GPU through CUDA "
        "IPC (a device-to-device copy out of its pool); off, or between GPUs: through host memory",
    )
    handoff_addr: str = derived("", "--role decode: where its scheduler takes hand-offs")
    kv_addr: str = derived("", "--role decode: where its scheduler's KV receiver listens")

    scheduler = RunnerSetting[SchedulerConfig]()  # the KV pool the runner builds follows it
    device = RunnerSetting[str]()
    tp_size = RunnerSetting[int]()
    model_path = RunnerSetting[str]("model")  # the HF folder or preset the model resolved to
    vocab_limit = RunnerSetting[int | None]()
    gpu_share = RunnerSetting[int]()
    dummy_weights = RunnerSetting[bool]()

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

    @property
    def token_addr(self) -> str:
        """Where scheduler rank 0 sends its ``TokenBatch``: the detokenizer of its replica
        (``split``) or the frontend (``frontend``); ``inline`` sends text there instead."""
        return self.detokenizer_addr if self.layout == "split" else self.frontend_addr

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
