"""The scheduler core shared by the real engine and the simulator.

Plain Python on ints and lists: importing it imports neither torch nor zmq,
and nothing in it reads a clock.
"""

from core.scheduler.config import ROLES, SchedulerConfig, SchedulerStats
from core.scheduler.drafter import Drafter, NgramDrafter, PlaceholderDrafter
from core.scheduler.inflight import PlanOrderError
from core.scheduler.pages import OutOfPages, PageAllocator
from core.scheduler.plan import *  # noqa: F403  (the plan types; see plan.__all__)
from core.scheduler.plan import __all__ as _plan_names
from core.scheduler.policy import POLICIES, Policy, get_policy
from core.scheduler.radix import RadixCache
from core.scheduler.request import Request, RequestRejected, RequestStatus
from core.scheduler.scheduler import Scheduler
from core.scheduler.shape import StepShape

__all__ = [
    *_plan_names,
    "POLICIES",
    "ROLES",
    "Drafter",
    "NgramDrafter",
    "OutOfPages",
    "PageAllocator",
    "PlaceholderDrafter",
    "PlanOrderError",
    "Policy",
    "RadixCache",
    "Request",
    "RequestRejected",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "StepShape",
    "get_policy",
]
