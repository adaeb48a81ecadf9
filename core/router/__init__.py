"""The router core: places requests on data-parallel workers (see ``core.router.router``)."""

from core.router import cache_aware, session  # noqa: F401  (registers their policies)
from core.router.config import RouterConfig
from core.router.policy import POLICIES, Decision, Policy, make_policy, register
from core.router.prefix_tree import PrefixTree
from core.router.request import Health, NoWorkerAvailable, RouteRequest, WorkerLoad
from core.router.router import Router, WorkerStats

__all__ = [
    "POLICIES",
    "Decision",
    "Health",
    "NoWorkerAvailable",
    "Policy",
    "PrefixTree",
    "RouteRequest",
    "Router",
    "RouterConfig",
    "WorkerLoad",
    "WorkerStats",
    "make_policy",
    "register",
]
