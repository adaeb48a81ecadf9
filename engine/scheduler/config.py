"""Scheduler configuration and statistics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits of one scheduler.

    ``max_prefill_tokens`` is the per-step prefill token budget (chunked
    prefill); ``max_running`` caps requests holding KV (prefilling + decoding).
    """

    num_pages: int
    page_size: int = 16
    max_running: int = 256
    max_prefill_tokens: int = 8192
    policy: str = "fcfs"
    prefix_cache: bool = True

    def __post_init__(self) -> None:
        for name in ("num_pages", "page_size", "max_running", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")


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
