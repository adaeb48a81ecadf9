"""The router's settings, declared once: the HTTP router and the simulator read them here."""

from __future__ import annotations

from dataclasses import dataclass

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

    policy: str = "round_robin"
    load: str = "requests"
    seed: int = 0
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    balance_rel_threshold: float = 1.5
    prefix_ttl_s: float = 120.0
    max_prefix_items: int = 1 << 20
    session_ttl_s: float = 600.0

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
