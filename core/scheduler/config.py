"""Scheduler configuration and statistics."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from core.settings import derived

HOST_KV_POLICIES = ("write_back", "write_through")
ROLES = ("colocated", "prefill", "decode")  # prefill/decode disaggregation (core.scheduler.handoff)


def _setting(default: Any, help: str) -> Any:
    """A field with its default and the help text its flag shows (``core.scheduler.options``)."""
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits and policy of one scheduler: every scheduler setting, declared here once.

    The engine (``engine serve``) and the simulator (``sim replay``) hold this
    object and take its flags and defaults from it (``core.scheduler.options``).
    ``num_pages`` None means "as many as the KV memory holds": each world sizes
    it (the runner from free device memory, the simulator from the model and
    hardware) before it builds a ``Scheduler``, which needs a count.

    ``max_prefill_tokens`` is the per-step prefill token budget (chunked
    prefill); ``max_running`` caps requests holding KV (prefilling + decoding).

    ``reserve_decode`` makes admission keep room for the decode growth of the
    running requests, estimated with the new-token ratio (see
    ``core.scheduler.reservation``): it starts at ``init_new_token_ratio``,
    falls to ``min_new_token_ratio`` over ``new_token_ratio_decay_steps`` decode
    steps and restarts after a preemption. The defaults are SGLang's (0.7,
    0.7 x 0.14, 600 steps).

    The host KV tier (``core.scheduler.host_tier``) keeps pages evicted from
    the device in host memory and loads them back on a hit. ``host_kv_gb`` 0
    turns it off (the scheduler is then exactly the one without a tier); like
    ``num_pages``, each world turns the gigabytes into ``host_kv_pages`` from
    its bytes per page, unless ``host_kv_pages`` is given. ``host_kv_policy``
    says when a page is copied to the host: ``write_back`` when the device
    evicts it, ``write_through`` as soon as it enters the prefix cache. The
    tier holds prefix cache pages: without ``prefix_cache`` it is not built.

    ``num_draft_tokens`` turns on speculative decoding: a decoding request's
    slot carries at most that many draft tokens per step, proposed by the
    ``Drafter`` the scheduler is built with (``core.scheduler.drafter``); 0, or
    no drafter, is the scheduler without speculation.

    ``role`` is the instance's part in prefill/decode disaggregation
    (``core.scheduler.handoff``): ``colocated`` (prefill and decode here, the
    default), ``prefill`` (a request ends after its first token and its pages
    wait for their transfer) or ``decode`` (requests arrive with their KV).
    It is derived, not a flag: a launch that disaggregates sets it per instance.
    """

    num_pages: int | None = _setting(None, "KV pages; left out: as many as the KV memory holds")
    page_size: int = _setting(16, "tokens per KV page")
    max_running: int = _setting(256, "requests holding KV at once (prefilling + decoding)")
    max_prefill_tokens: int = _setting(8192, "prefill token budget of one step (chunked prefill)")
    policy: str = _setting("fcfs", "scheduling policy")
    prefix_cache: bool = _setting(True, "share computed prompt prefixes (radix cache)")
    reserve_decode: bool = _setting(
        False, "admission reserves room for decode growth (the new-token ratio)"
    )
    init_new_token_ratio: float = _setting(0.7, "new-token ratio at start and after a preemption")
    min_new_token_ratio: float = _setting(0.098, "the ratio's floor")
    new_token_ratio_decay_steps: int = _setting(
        600, "decode steps from the initial ratio to the floor"
    )
    host_kv_gb: float = _setting(0.0, "host KV tier capacity in GB; 0: no host tier")
    host_kv_pages: int = _setting(0, "host KV tier capacity in pages; 0: from --host-kv-gb")
    host_kv_policy: str = _setting(
        "write_back",
        "when pages are copied to the host tier: write_back (on device eviction)"
        " or write_through (on entering the prefix cache)",
    )
    num_draft_tokens: int = _setting(
        0, "draft tokens per decoding request and step (speculative decoding); 0: off"
    )
    role: str = derived("colocated", "each instance's part in prefill/decode disaggregation")

    def __post_init__(self) -> None:
        for name in (
            "page_size",
            "max_running",
            "max_prefill_tokens",
            "new_token_ratio_decay_steps",
        ):
            _check_positive(name, getattr(self, name))
        if self.num_pages is not None:
            _check_positive("num_pages", self.num_pages)
        _check_non_negative("num_draft_tokens", self.num_draft_tokens)
        if not 0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1:
            raise ValueError(
                "new-token ratios must satisfy 0 <= min_new_token_ratio <= init_new_token_ratio"
                f" <= 1, got {self.min_new_token_ratio!r} and {self.init_new_token_ratio!r}"
            )
        if self.host_kv_gb < 0 or self.host_kv_pages < 0:
            raise ValueError(
                f"host_kv_gb and host_kv_pages must be >= 0, got {self.host_kv_gb!r}"
                f" and {self.host_kv_pages!r}"
            )
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}; known: {', '.join(ROLES)}")
        if self.host_kv_policy not in HOST_KV_POLICIES:
            raise ValueError(
                f"unknown host_kv_policy {self.host_kv_policy!r};"
                f" known: {', '.join(HOST_KV_POLICIES)}"
            )

    @property
    def pages(self) -> int:
        """``num_pages``, which a ``Scheduler`` needs resolved."""
        if self.num_pages is None:
            raise ValueError("num_pages must be sized (a positive integer) before a scheduler runs")
        return self.num_pages

    @property
    def host_pages(self) -> int:
        """``host_kv_pages``: 0 without a host tier; ``ValueError`` while GB are not sized."""
        if self.host_kv_gb > 0 and not self.host_kv_pages:
            raise ValueError("host_kv_gb must be sized into host_kv_pages before a scheduler runs")
        return self.host_kv_pages

    def sized_host_tier(self, bytes_per_page: int) -> SchedulerConfig:
        """This config with ``host_kv_pages`` from ``host_kv_gb`` (pages of ``bytes_per_page``)."""
        pages = host_pages_for(self.host_kv_gb, self.host_kv_pages, bytes_per_page)
        return self if pages == self.host_kv_pages else replace(self, host_kv_pages=pages)


def host_pages_for(host_kv_gb: float, host_kv_pages: int, bytes_per_page: int) -> int:
    """Host tier pages: ``host_kv_pages`` when given, else as many as ``host_kv_gb`` holds."""
    if host_kv_pages or host_kv_gb == 0:
        return host_kv_pages
    pages = int(host_kv_gb * 1e9) // bytes_per_page
    if pages < 1:
        raise ValueError(f"host_kv_gb {host_kv_gb} holds no KV page of {bytes_per_page} bytes")
    return pages


def _check_positive(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_non_negative(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


@dataclass(frozen=True, slots=True)
class SchedulerStats:
    """A snapshot for metrics. ``pages_cached`` are unreferenced (evictable) cache pages."""

    num_pages: int
    pages_used: int
    pages_free: int
    pages_cached: int
    num_waiting: int
    num_running: int
    prompt_tokens: int
    cached_tokens: int
    host_pages: int = 0
    host_pages_used: int = 0
    host_hit_tokens: int = 0  # of ``cached_tokens``, those loaded from the host tier
    host_loaded_tokens: int = 0
    host_written_tokens: int = 0

    @property
    def pages_held(self) -> int:
        """Pages held by live requests (used minus evictable cache)."""
        return self.pages_used - self.pages_cached

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
