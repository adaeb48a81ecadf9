"""Plans made but not completed, and the pages that wait for them.

Overlap scheduling calls ``schedule`` while the previous plan still runs, so up
to two plans are outstanding between a ``schedule`` and the ``complete`` of the
older one. Plans complete in the order they were made. Pages that a request
gives up while an outstanding plan still reads or writes them are held here
and go back to the pool when that plan completes::

    schedule(N)  ─►  schedule(N+1)  ─►  complete(N)  ─►  schedule(N+2)  ─►  complete(N+1) ...
                     (N in flight)      (N+1 in flight)   (N+1 in flight)

Strict alternation is the case with at most one plan outstanding, completed
before the next ``schedule``: nothing is ever held.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from core.scheduler.memory import HeldPages
from core.scheduler.plan import Plan

MAX_OUTSTANDING = 2


class PlanOrderError(RuntimeError):
    """``schedule`` with two plans outstanding, or ``complete`` of a plan out of order."""


@dataclass(slots=True)
class Outstanding:
    """A plan made and not yet completed, with what waits for its completion."""

    plan: Plan
    abort_counts: dict[str, int]  # output tokens of the requests it aborts
    held: list[HeldPages] = field(default_factory=list)  # released when it completes


class InFlight:
    """The outstanding plans, oldest first; ``completed`` is the last completed step."""

    def __init__(self) -> None:
        self._plans: deque[Outstanding] = deque()
        self.completed = 0

    def __len__(self) -> int:
        return len(self._plans)

    def check_can_schedule(self) -> None:
        if len(self._plans) >= MAX_OUTSTANDING:
            steps = [o.plan.step for o in self._plans]
            raise PlanOrderError(
                f"schedule() with plans {steps} outstanding: complete step {steps[0]} first"
            )

    def add(self, plan: Plan, abort_counts: dict[str, int]) -> None:
        self._plans.append(Outstanding(plan, abort_counts))

    def pop(self, plan: Plan) -> Outstanding:
        """Complete ``plan``, which must be the oldest outstanding one."""
        if not self._plans or self._plans[0].plan.step != plan.step:
            oldest = self._plans[0].plan.step if self._plans else None
            raise PlanOrderError(
                f"complete(step {plan.step}) but the oldest outstanding plan is step {oldest}"
            )
        self.completed = plan.step
        return self._plans.popleft()

    def uses(self, last_plan: int) -> bool:
        """Whether an outstanding plan may use the pages of a request last placed at that step."""
        return last_plan > self.completed

    def hold(self, step: int, held: HeldPages) -> None:
        """Keep ``held`` until the outstanding plan of ``step`` completes."""
        for o in self._plans:
            if o.plan.step == step:
                o.held.append(held)
                return
        raise AssertionError(f"no outstanding plan of step {step}")

    def held(self) -> list[HeldPages]:
        return [h for o in self._plans for h in o.held]

    def pending_pages(self) -> int:
        """Pages that come back (free or evictable) when the outstanding plans complete."""
        return sum(h.num_private for o in self._plans for h in o.held)

    def oldest(self) -> Plan | None:
        return self._plans[0].plan if self._plans else None

    def plans(self) -> list[Plan]:
        return [o.plan for o in self._plans]

    def replace_oldest(self, plan: Plan) -> None:
        """A decode run completed the oldest plan and left ``plan`` in flight (nothing held)."""
        old = self._plans.popleft()
        assert not old.held and not old.abort_counts
        self.completed = plan.step - 1
        self._plans.appendleft(Outstanding(plan, {}))
