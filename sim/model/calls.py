"""Record the simulator's calls to the scheduler core, and replay them on a fresh one.

The recording is the proof that the simulator only drives the core: replaying
the same calls on a new ``Scheduler`` must give the same plans, events and
decode runs, with no second implementation of any decision. ``complete`` is
recorded by the step of its plan, so overlapped calls (``schedule`` of step
N+1 before ``complete`` of step N, a decode run that leaves its last plan in
flight) replay in their order too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from core.scheduler import (
    DecodeRun,
    Drafter,
    Event,
    Plan,
    Request,
    RequestRejected,
    Scheduler,
    SchedulerConfig,
)

REQUEST_FIELDS = (
    "rid",
    "prompt_len",
    "max_new_tokens",
    "arrival",
    "block_hashes",
    "block_size",
    "priority",
    "expected_output_len",
)


@dataclass(frozen=True, slots=True)
class Call:
    name: str  # add | schedule | complete | decode_run_length | advance_decode
    args: tuple[Any, ...]
    result: Any


class RecordingScheduler:
    """A ``Scheduler`` whose state-changing calls and answers are logged in ``calls``."""

    def __init__(self, inner: Scheduler) -> None:
        self.inner = inner
        self.calls: list[Call] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def add(self, req: Request) -> None:
        spec = {f: getattr(req, f) for f in REQUEST_FIELDS}
        spec["block_hashes"] = tuple(spec["block_hashes"])
        try:
            self.inner.add(req)
        except RequestRejected as exc:
            self.calls.append(Call("add", (spec,), f"rejected: {exc}"))
            raise
        self.calls.append(Call("add", (spec,), None))

    def schedule(self, now: float) -> Plan:
        plan = self.inner.schedule(now)
        self.calls.append(Call("schedule", (now,), plan))
        return plan

    def complete(
        self, plan: Plan, tokens: dict[str, int] | None, *, accepted: dict[str, int] | None = None
    ) -> list[Event]:
        events = self.inner.complete(plan, tokens, accepted=accepted)
        args = (plan.step,) if accepted is None else (plan.step, accepted)
        self.calls.append(Call("complete", args, tuple(events)))
        return events

    def decode_run_length(self, max_steps: int) -> int:
        k = self.inner.decode_run_length(max_steps)
        self.calls.append(Call("decode_run_length", (max_steps,), k))
        return k

    def advance_decode(self, k: int) -> DecodeRun:
        run = self.inner.advance_decode(k)
        self.calls.append(Call("advance_decode", (k,), run))
        return run


def replay_calls(
    calls: list[Call], config: SchedulerConfig, drafter: Drafter | None = None
) -> list[str]:
    """Replay ``calls`` on a fresh scheduler (with ``drafter``, as the simulated one had);
    return the mismatches (empty when equal)."""
    s = Scheduler(config, drafter)
    plans: dict[int, Plan] = {}
    problems: list[str] = []
    for i, call in enumerate(calls):
        got: Any
        if call.name == "add":
            spec = dict(call.args[0])
            spec["block_hashes"] = list(spec["block_hashes"])
            try:
                s.add(Request(**spec))
                got = None
            except RequestRejected as exc:
                got = f"rejected: {exc}"
        elif call.name == "schedule":
            got = s.schedule(*call.args)
            plans[got.step] = got
        elif call.name == "complete":
            accepted = call.args[1] if len(call.args) > 1 else None
            got = tuple(s.complete(plans.pop(call.args[0]), None, accepted=accepted))
        elif call.name == "decode_run_length":
            got = s.decode_run_length(*call.args)
        elif call.name == "advance_decode":
            got = s.advance_decode(*call.args)
            if got.in_flight is not None:
                plans[got.in_flight.step] = got.in_flight
        else:
            raise ValueError(f"unknown call {call.name!r}")
        if got != call.result:
            problems.append(f"call {i} {call.name}{call.args}: sim got {call.result!r}, "
                            f"replay got {got!r}")  # fmt: skip
    return problems
