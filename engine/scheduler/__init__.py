"""The scheduler core shared by the real engine and the simulator.

Plain Python on ints and lists: importing it imports neither torch nor zmq,
and nothing in it reads a clock.
"""

from engine.scheduler.config import SchedulerConfig, SchedulerStats
from engine.scheduler.pages import OutOfPages, PageAllocator
from engine.scheduler.plan import (
    BLOCKED_KV_MEMORY,
    BLOCKED_PREFILL_BUDGET,
    BLOCKED_RUNNING_CAP,
    DecodeRun,
    DecodeSlot,
    Event,
    Finished,
    FinishReason,
    Plan,
    Preempted,
    PrefillChunk,
    TokenOut,
)
from engine.scheduler.policy import POLICIES, Policy, get_policy
from engine.scheduler.radix import RadixCache
from engine.scheduler.request import Request, RequestStatus
from engine.scheduler.scheduler import PLACEHOLDER_TOKEN, RequestRejected, Scheduler

__all__ = [
    "BLOCKED_KV_MEMORY",
    "BLOCKED_PREFILL_BUDGET",
    "BLOCKED_RUNNING_CAP",
    "PLACEHOLDER_TOKEN",
    "POLICIES",
    "DecodeRun",
    "DecodeSlot",
    "Event",
    "FinishReason",
    "Finished",
    "OutOfPages",
    "PageAllocator",
    "Plan",
    "Policy",
    "Preempted",
    "PrefillChunk",
    "RadixCache",
    "Request",
    "RequestRejected",
    "RequestStatus",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerStats",
    "TokenOut",
    "get_policy",
]
