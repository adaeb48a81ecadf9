"""Replay configuration: defaults, a JSON/TOML config file, then command-line overrides.

Defaults model Llama-3.1-8B in bf16 on one H200. Unless ``num_pages`` or
``kv_memory_gb`` is given, the KV cache gets what is left of each GPU after the
weights, within ``mem_fraction`` (0.85, the engine's ``--mem-fraction``; the rest
is headroom for activations and the CUDA context):

    kv bytes per GPU = hbm * mem_fraction - weight bytes / tp
    num_pages        = kv bytes per GPU // (page_size * KV bytes per token per GPU)

The host KV tier (``host_kv_gb``, per GPU as the engine's is per rank) is sized
into ``host_kv_pages`` with the same bytes per page.

Step times: ``build_config`` (every command) prices steps with the ``table``
model of the committed profile of the model on the hardware
(``sim.costs.committed``) unless a profile or a cost model is asked for, and
with the ``roofline`` when no such profile is committed;
``cost_model_by_default`` records that choice. Unless ``overlap`` is given, it
simulates the scheduling loop the profile's engine runs: overlapped for a
profile measured on CUDA, the strict loop for one measured on CPU or without a
profile (``overlap_by_default`` records that choice).

Speculative decoding (``speculative``, as ``engine serve --speculative``): the
scheduler is built with ``PlaceholderDrafter``, every decoding request's slot
carries up to ``num_draft_tokens`` drafts (4 when left out, as the engine's),
and the ``acceptance`` model says how many are accepted (``sim.costs.acceptance``;
required: the simulator assumes none), drawn with ``seed``, and what share of
the decode slots carry a draft at all (``draft_share`` overrides it;
``sim.model.drafter``).
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from core.router import RouterConfig
from core.router.options import ROUTER_KEYS, pop_router_config, router_keys
from core.scheduler import POLICIES, SchedulerConfig
from core.settings import mem_fraction_setting, setting
from schema.layouts import LAYOUTS
from sim.costs import CostSpec, Profile
from sim.costs.acceptance import DRAWS, AcceptanceModel
from sim.costs.acceptance_files import load_acceptance
from sim.costs.committed import committed_profile
from sim.costs.presets import DTYPE_BYTES, hardware, model_shape
from sim.costs.profile import display_path, profile_device
from sim.costs.transfer import check_disaggregated

SECTIONS = ("scheduler", "model", "costs", "pipeline")
SPECULATIVE_METHODS = ("none", "ngram", "self", "synthetic")
"""``engine serve --speculative``'s drafters (``engine.speculative.METHODS``; a test keeps them
equal): the simulator models the named drafter by its acceptance, its drafts are placeholders
(``synthetic``: the engine's set rates, given as ``--acceptance``; ``self``: its drafting
layers priced too, ``draft_layers``)."""
DEFAULT_DRAFT_TOKENS = 4
"""``--num-draft-tokens`` when ``--speculative`` is on and it is left out, as the engine's."""
SCHEDULER_KEYS = frozenset(f.name for f in fields(SchedulerConfig))


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything a replay depends on (besides the trace); recorded in summary.json."""

    # model and hardware
    model: str = "llama-3.1-8b"
    hardware: str = "h200"
    tp: int = 1
    dtype: str = "bf16"
    kv_dtype: str = "bf16"
    mem_fraction: float = mem_fraction_setting()  # declared once, for the engine too
    # scheduler: the core's settings, and the KV memory that sizes num_pages when it is None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_memory_gb: float | None = None  # KV cache bytes per GPU, in 1e9 bytes
    # costs
    cost_model: str = "roofline"
    profile: str | None = None
    cost_model_by_default: bool = False  # build_config chose cost_model and profile, unasked
    cpu_profile: str | None = None  # CPU stage costs first from this profile (None: the
    # profile's, else the committed profiles/cpu_costs.csv)
    # pipeline
    num_tokenizers: int = 1  # tokenizer worker processes (the split layout's; one otherwise)
    tokenize_busy: bool = setting(
        False,
        "price a prompt a tokenizer goes straight on to (it waited in the tokenizer's queue) "
        "at the profile's back-to-back rate (its tokenize_busy_N rows) instead of the rate of "
        "a tokenizer that was idle",
    )
    layout: str = setting(
        "split",
        "where tokenization and detokenization run, as engine serve --layout: split (worker "
        "processes, an IPC hop each way), frontend (the frontend's process), inline (the "
        "scheduler's loop, between steps)",
        choices=LAYOUTS,
    )
    # overlap scheduling: plan step N+1 while step N runs (sim.model.scheduler_loop);
    # build_config sets it to the loop the profile's engine runs unless asked
    overlap: bool = False
    overlap_by_default: bool = False  # build_config chose overlap, unasked
    fast_forward: bool = True
    max_run_steps: int = 4096
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    # cluster: replicas behind one router (sim.model.cluster); flat keys per core.router.options
    replicas: int = 1
    router: RouterConfig = field(default_factory=RouterConfig)
    # a co-location table (CSV, sim.costs.colocation): the replicas share one GPU, as the
    # engine's ``--dp-share-gpu`` runs them, and stretch each other's steps by it
    colocation: str | None = None
    # the replicas share one frontend and tokenizer pool, as ``engine serve --dp N`` runs
    # them (else each has its own, as N servers behind ``engine router``)
    shared_frontend: bool = False
    # the frontend's one event loop also streams every token, as the engine's does: a
    # request's intake waits behind the chunks streamed before it (sim.model.frontend).
    # Off (two separate queues) by default: at a chunk's true cost (~25 us on an H200
    # host) it moved no validated P50/P90 by more than 1 point (one P99 by 3.6) and costs
    # 1.18x the wall time (reports/validate_h200/, reports/sim_speed/)
    frontend_loop: bool = False
    # speculative decoding: the drafter modelled, and how many of its drafts the target accepts
    # (sim.costs.acceptance); the scheduler's num_draft_tokens bounds a draft
    speculative: str = setting(
        "none",
        "speculative decoding, as engine serve --speculative: none, ngram, self or synthetic (each "
        f"modelled by --acceptance; --num-draft-tokens at most, {DEFAULT_DRAFT_TOKENS} when left "
        "out)",
        choices=SPECULATIVE_METHODS,
    )
    acceptance: str | None = setting(
        None,
        "how many draft tokens the target accepts, needed with --speculative: per-position "
        "rates a_1,..,a_K (one rate: the same at every position), or the engine's measurement: "
        "its /metrics page saved to a file, a JSON of accepted_lengths or rates, or its step "
        "record (engine_steps.csv)",
        metavar="RATES_OR_FILE",
    )
    acceptance_draw: str = setting(
        "rates",
        "rates: a slot accepts draft tokens one by one at the per-position rates; empirical: its "
        "accepted count drawn from the measured histogram",
        choices=DRAWS,
    )
    draft_share: float | None = setting(
        None,
        "share of decode slots that carry a draft, in [0, 1] (the engine's n-gram drafter "
        "drafts only where it finds a match); overrides the --acceptance measurement's, which "
        "is 1 for rates given by hand",
    )
    draft_layers: int | None = setting(
        None,
        "self (and required by it): the engine's --draft-layers; each draft token costs the "
        "drafting request that share of the model's layers of a batch-1 decode step at its "
        "context, in the scheduler's time before the step's launch",
    )
    seed: int = setting(
        0, "seed of the simulator's random draws (accepted draft tokens, slots drafted)"
    )
    # prefill/decode disaggregation (sim.model.pd_cluster), in place of ``replicas``
    prefill_replicas: int = setting(
        0,
        "prefill replicas (engine serve --role prefill) behind a PD router, with "
        "--decode-replicas: a disaggregated cluster in place of --replicas (0: colocated)",
    )
    decode_replicas: int = setting(
        0, "decode replicas (engine serve --role decode), with --prefill-replicas"
    )
    transfer_latency_s: float | None = setting(
        None, "disaggregated: a KV transfer's fixed time (default: the profile's kv_transfer)"
    )
    transfer_gbps: float | None = setting(
        None,
        "disaggregated: the KV transfer's GB/s of KV bytes (default: the profile's "
        "kv_transfer_token)",
    )

    def __post_init__(self) -> None:
        model_shape(self.model)
        hw = hardware(self.hardware)
        for name in ("dtype", "kv_dtype"):
            if getattr(self, name) not in DTYPE_BYTES:
                raise ValueError(f"{name} must be one of {sorted(DTYPE_BYTES)}")
        if self.dtype not in hw.peak_flops and self.cost_model == "roofline":
            raise ValueError(f"no measured {self.dtype} peak for {hw.name}")
        if self.layout not in LAYOUTS:
            raise ValueError(f"unknown layout {self.layout!r}; known: {list(LAYOUTS)}")
        if self.scheduler.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.scheduler.policy!r}; known: {sorted(POLICIES)}")
        for name in ("tp", "num_tokenizers", "max_run_steps", "replicas"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 < self.mem_fraction <= 1:
            raise ValueError("mem_fraction must be in (0, 1]")
        if self.kv_memory_gb is not None and not self.kv_memory_gb > 0:
            raise ValueError("kv_memory_gb must be > 0")
        for name in ("slo_ttft_ms", "slo_tpot_ms"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be > 0")
        self._check_speculative()
        check_disaggregated(
            self.prefill_replicas, self.decode_replicas, self.replicas, self.shared_frontend,
            self.speculating, self.transfer_latency_s, self.transfer_gbps,
        )  # fmt: skip

    def _check_speculative(self) -> None:
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(
                f"unknown speculative {self.speculative!r}; known: {list(SPECULATIVE_METHODS)}"
            )
        if self.acceptance_draw not in DRAWS:
            raise ValueError(f"unknown acceptance_draw {self.acceptance_draw!r}; known: {DRAWS}")
        if (self.draft_layers is not None) != (self.speculative == "self"):
            raise ValueError("draft_layers goes with speculative self, and self needs it")
        if self.draft_layers is not None:
            layers = model_shape(self.model).num_layers
            if not 1 <= self.draft_layers < layers:
                raise ValueError(
                    f"draft_layers takes 1 to {layers - 1} of {self.model}'s {layers} layers, "
                    f"got {self.draft_layers}"
                )
        if not self.speculating:
            return
        k = self.scheduler.num_draft_tokens
        if k < 1:
            raise ValueError(f"speculative {self.speculative} needs num_draft_tokens >= 1, got {k}")
        if self.acceptance is None:
            raise ValueError(
                f"speculative {self.speculative} needs an acceptance model (--acceptance): rates, "
                "or the engine's measurement of them; the simulator assumes none"
            )
        self.acceptance_model()

    @property
    def speculating(self) -> bool:
        """Whether decode slots carry drafts (a drafter modelled; ``num_draft_tokens`` bounds
        them). Without one the core drafts nothing, whatever ``num_draft_tokens`` says."""
        return self.speculative != "none"

    def acceptance_model(self) -> AcceptanceModel | None:
        """The acceptance model ``acceptance`` names (None when not speculating)."""
        if not self.speculating or self.acceptance is None:
            return None
        empirical = self.acceptance_draw == "empirical"
        k = self.scheduler.num_draft_tokens
        return load_acceptance(self.acceptance, k, empirical, self.draft_share)

    @property
    def disaggregated(self) -> bool:
        return self.prefill_replicas > 0

    @property
    def num_replicas(self) -> int:
        """The servers simulated: replicas, or the prefill and decode ones."""
        return self.prefill_replicas + self.decode_replicas if self.disaggregated else self.replicas

    def kv_bytes_per_token_per_gpu(self) -> float:
        return model_shape(self.model).kv_bytes_per_token(DTYPE_BYTES[self.kv_dtype], self.tp)

    def resolved_num_pages(self) -> int:
        """KV pages per the rules in the module docstring."""
        if self.scheduler.num_pages is not None:
            return self.scheduler.num_pages
        page_bytes = self.scheduler.page_size * self.kv_bytes_per_token_per_gpu()
        if self.kv_memory_gb is not None:
            kv_bytes = self.kv_memory_gb * 1e9
        else:
            m = model_shape(self.model)
            weights = m.num_params * DTYPE_BYTES[self.dtype] / self.tp
            kv_bytes = hardware(self.hardware).hbm_bytes * self.mem_fraction - weights
        pages = int(kv_bytes // page_bytes)
        if pages < 1:
            raise ValueError(
                f"{self.model} on {self.tp}x {self.hardware} leaves no memory for the KV cache"
            )
        return pages

    def scheduler_config(self) -> SchedulerConfig:
        """The core's configuration, with ``num_pages`` and the host tier sized."""
        page_bytes = self.scheduler.page_size * self.kv_bytes_per_token_per_gpu()
        sized = replace(self.scheduler, num_pages=self.resolved_num_pages())
        return sized.sized_host_tier(math.ceil(page_bytes))

    @classmethod
    def from_flat(cls, **values: Any) -> SimConfig:
        """A config from flat keys: a ``SchedulerConfig`` field's name sets the scheduler's."""
        settings = {k: values.pop(k) for k in SCHEDULER_KEYS & values.keys()}
        router = pop_router_config(values)
        return cls(scheduler=SchedulerConfig(**settings), router=router, **values)

    def __getattr__(self, name: str) -> Any:
        """The scheduler's settings read flat too: ``config.policy``."""
        if name in SCHEDULER_KEYS:
            return getattr(self.scheduler, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def cost_spec(self, profile: Profile | None) -> CostSpec:
        return CostSpec(self.model, self.hardware, self.tp, self.dtype, self.kv_dtype, profile)

    def cost_model_choice(self) -> str:
        """How the step-time model was chosen, in words (the summary's ``cost_model.chosen``)."""
        if not self.cost_model_by_default:
            return "as requested"
        what = f"{self.model} on {self.hardware}, tp {self.tp}, {self.dtype}"
        if self.profile:
            return f"by default: the committed profile of {what} (the roofline on request)"
        return f"by default: no profile of {what} is committed, so the roofline"

    def overlap_choice(self) -> str:
        """Which scheduling loop runs and why, in words (the summary's ``overlap``)."""
        return overlap_choice(self.overlap, self.overlap_by_default, self.profile)

    def to_dict(self) -> dict[str, Any]:
        """Flat keys, as a config file gives them, and the page count they resolve to."""
        out = asdict(self)
        out.update(out.pop("scheduler"))
        out.pop("router")
        out.update(router_keys(self.router))
        out["resolved_num_pages"] = self.resolved_num_pages()
        return out


def read_config_file(path: Path | str) -> dict[str, Any]:
    """Keys of a JSON or TOML config file; tables named in ``SECTIONS`` are flattened."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such config file")
    text = path.read_text(encoding="utf-8")
    try:
        raw = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot parse config ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a config file must hold a table/object")
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        if key in SECTIONS and isinstance(value, dict):
            flat.update(value)
        else:
            flat[key] = value
    known = CONFIG_KEYS
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ValueError(f"{path}: unknown config keys {unknown}; known: {sorted(known)}")
    return flat


def build_config(file: Path | str | None = None, /, **overrides: Any) -> SimConfig:
    """Defaults, then ``file``, then the ``overrides`` that are not None."""
    values: dict[str, Any] = read_config_file(file) if file is not None else {}
    values.update({k: v for k, v in overrides.items() if v is not None})
    if values.get("profile"):
        values.setdefault("cost_model", "table")
    elif values.get("cost_model", "table") == "table":
        _default_costs(values)
    if "overlap" not in values:
        values["overlap"] = engine_overlaps(values.get("profile"))
        values["overlap_by_default"] = True
    if values.get("speculative", "none") != "none":
        values.setdefault("num_draft_tokens", DEFAULT_DRAFT_TOKENS)
    return SimConfig.from_flat(**values)


def overlap_choice(overlap: bool, by_default: bool, profile: str | None) -> str:
    """``on`` or ``off``, and why: as requested, or the loop of the profile's engine."""
    state = "on" if overlap else "off"
    if not by_default:
        return f"{state} (as requested)"
    if overlap:
        return f"{state} (the profile's engine runs it on cuda; --no-overlap: the strict loop)"
    if profile:
        return f"{state} (the profile's engine runs the strict loop on its device; --overlap)"
    return f"{state} (no profile names an engine to follow: the strict loop; --overlap)"


def engine_overlaps(profile: str | None) -> bool:
    """Whether the engine a profile was measured on overlaps scheduling by default: it does on
    CUDA (``engine serve --overlap``'s default), not on CPU; no profile: no engine to follow."""
    if not profile:
        return False
    return profile_device(profile).startswith("cuda")


def _default_costs(values: dict[str, Any]) -> None:
    """Neither a profile nor the roofline asked for: the committed profile of the model on the
    hardware, else (unless the ``table`` model was asked for, an error later) the roofline."""
    keys = ("model", "hardware", "tp", "dtype", "kv_dtype")
    defaults = {f.name: f.default for f in fields(SimConfig) if f.name in keys}
    path = committed_profile(*(values.get(k, defaults[k]) for k in keys))
    if path is not None:
        values.update(cost_model="table", profile=display_path(path))
    elif "cost_model" in values:
        return
    values.setdefault("cost_model", "roofline")
    values["cost_model_by_default"] = True


CONFIG_KEYS = (
    frozenset(f.name for f in fields(SimConfig))
    - {"scheduler", "router", "cost_model_by_default", "overlap_by_default"}
    | SCHEDULER_KEYS
    | ROUTER_KEYS.keys()
)
"""The keys of a config file (and of ``build_config``): flat, scheduler and router settings
included; not ``cost_model_by_default`` nor ``overlap_by_default``, which only
``build_config`` sets."""
