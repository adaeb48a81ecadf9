"""The scheduler core shared by the real engine and the simulator.

Plain Python on ints and lists: importing it imports neither torch nor zmq,
and nothing in it reads a clock.
"""

from engine.scheduler.config import SchedulerConfig, SchedulerStats
from engine.scheduler.inflight import PlanOrderError
from engine.scheduler.pages import OutOfPages, PageAllocator
from engine.scheduler.plan import *  # noqa: F403  (the plan types; see plan.__all__)
from engine.scheduler.plan import __all__ as _plan_names
from engine.scheduler.policy import POLICIES, Policy, get_policy
from engine.scheduler.radix import RadixCache
from engine.scheduler.request import Request, RequestRejected, RequestStatus
from engine.scheduler.scheduler import Scheduler

__all__ = [
    *_plan_names,
    "POLICIES",
    "OutOfPages",
    "PageAllocator",
    "PlanOrderError",
    "Policy",
    "RadixCache",
    "Request",
    "RequestRejected",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "get_policy",
]
