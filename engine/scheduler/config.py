"""Scheduler configuration and statistics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one scheduler.

    ``max_prefill_tokens`` is the per-step prefill token budget (chunked
    prefill); ``max_running`` caps requests holding KV (prefilling + decoding).

    ``reserve_decode`` makes admission keep room for the decode growth of the
    running requests, estimated with the new-token ratio (see
    ``engine.scheduler.reservation``): it starts at ``init_new_token_ratio``,
    falls to ``min_new_token_ratio`` over ``new_token_ratio_decay_steps`` decode
    steps and restarts after a preemption. The defaults are SGLang's (0.7,
    0.7 x 0.14, 600 steps).
    """

    num_pages: int
    page_size: int = 16
    max_running: int = 256
    max_prefill_tokens: int = 8192
    policy: str = "fcfs"
    prefix_cache: bool = True
    reserve_decode: bool = False
    init_new_token_ratio: float = 0.7
    min_new_token_ratio: float = 0.098
    new_token_ratio_decay_steps: int = 600

    def __post_init__(self) -> None:
        for name in (
            "num_pages",
            "page_size",
            "max_running",
            "max_prefill_tokens",
            "new_token_ratio_decay_steps",
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not 0 <= self.min_new_token_ratio <= self.init_new_token_ratio <= 1:
            raise ValueError(
                "new-token ratios must satisfy 0 <= min_new_token_ratio <= init_new_token_ratio"
                f" <= 1, got {self.min_new_token_ratio!r} and {self.init_new_token_ratio!r}"
            )


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

    @property
    def pages_held(self) -> int:
        """Pages held by live requests (used minus evictable cache)."""
        return self.pages_used - self.pages_cached

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
