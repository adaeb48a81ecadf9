"""The router's settings, declared once: the HTTP router and the simulator read them here."""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import setting

LOADS = ("requests", "tokens")


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """How the router picks a worker.

    ``load`` is what "least loaded" counts: outstanding requests, or
    outstanding tokens (prompt plus expected output). ``seed`` feeds the
    router's own ``random.Random`` (``power_of_two``), so the same inputs give
    the same decisions.

    ``cache_aware`` follows SGLang's router: the longest cached prefix wins
    when its match ratio exceeds ``cache_threshold``, but only on a worker
    whose load is balanced against the least loaded one. A load ``L`` is
    *imbalanced* against the minimum ``m`` when both
    ``L - m > balance_abs_threshold`` and ``L > balance_rel_threshold * m``
    hold (in the unit of ``load``). Prefix entries expire ``prefix_ttl_s``
    after their last use (in the ``now`` passed in) and each worker's tree
    holds at most ``max_prefix_items`` key items.

    ``session_ttl_s`` is how long ``session_sticky`` keeps a session pinned to its
    worker after that session's last request.
    """

    policy: str = setting("round_robin", "routing policy")
    load: str = setting(
        "requests",
        "what least-loaded counts: outstanding requests, or tokens (prompt + expected output)",
        choices=LOADS,
    )
    seed: int = setting(0, "seed of the router's own random choices (power_of_two)")
    cache_threshold: float = setting(
        0.5, "cache_aware: the cached-prefix match ratio above which the longest match wins"
    )
    balance_abs_threshold: int = setting(
        32,
        "cache_aware: a load this far above the least (and the relative threshold) is imbalanced",
    )
    balance_rel_threshold: float = setting(
        1.5,
        "cache_aware: a load this many times the least (and the absolute threshold) is imbalanced",
    )
    prefix_ttl_s: float = setting(
        120.0, "cache_aware: seconds a prefix entry lives after its last use"
    )
    max_prefix_items: int = setting(1 << 20, "cache_aware: key items each worker's tree holds")
    session_ttl_s: float = setting(
        600.0, "session_sticky: seconds a session stays pinned after its last request"
    )

    def __post_init__(self) -> None:
        if self.load not in LOADS:
            raise ValueError(f"load must be one of {', '.join(LOADS)}, got {self.load!r}")
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold must be in [0, 1], got {self.cache_threshold!r}")
        if self.balance_abs_threshold < 0:
            raise ValueError(
                f"balance_abs_threshold must be >= 0, got {self.balance_abs_threshold!r}"
            )
        if not self.balance_rel_threshold >= 1.0:
            raise ValueError(
                f"balance_rel_threshold must be >= 1, got {self.balance_rel_threshold!r}"
            )
        for name in ("prefix_ttl_s", "session_ttl_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if isinstance(self.max_prefix_items, bool) or self.max_prefix_items < 1:
            raise ValueError(f"max_prefix_items must be >= 1, got {self.max_prefix_items!r}")

    def imbalanced(self, load: float, least: float) -> bool:
        """Whether ``load`` is too far above the least loaded worker's ``least``."""
        return (
            load - least > self.balance_abs_threshold and load > self.balance_rel_threshold * least
        )
