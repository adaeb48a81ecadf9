"""Generation without servers: the real ``Scheduler`` driving a ``ModelRunner`` in a loop.

This is the engine's step loop minus the sockets: add requests, then
``schedule -> step inputs -> runner.step -> complete`` until nothing is left.
Used for offline batches, profiling and tests.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from engine.runner.inputs import StepInputs
from engine.sampling.params import SamplingParams
from engine.scheduler import Event, Finished, Plan, Request, Scheduler, SchedulerConfig, TokenOut


class StepRunner(Protocol):
    """What the loop needs: a ``ModelRunner`` or a ``TPLeader``."""

    @property
    def num_pages(self) -> int: ...
    @property
    def page_size(self) -> int: ...
    @property
    def eos_token_ids(self) -> list[int]: ...
    def step(self, plan: Plan, inputs: StepInputs) -> list[int]: ...


@dataclass
class _Tracked:
    prompt_len: int
    params: SamplingParams
    sequence: list[int]
    finished: Finished | None = None
    output: list[int] = field(default_factory=list)


class OfflineEngine:
    """A scheduler and a runner in one loop; ``outputs[rid]`` are the generated ids."""

    def __init__(self, runner: StepRunner, config: SchedulerConfig) -> None:
        if config.num_pages > runner.num_pages or config.page_size != runner.page_size:
            raise ValueError(
                f"scheduler pages ({config.num_pages} x {config.page_size}) exceed the runner's "
                f"KV pool ({runner.num_pages} x {runner.page_size})"
            )
        self.runner = runner
        self.scheduler = Scheduler(config)
        self.requests: dict[str, _Tracked] = {}
        self.plans: list[Plan] = []
        self.now = 0.0

    def add(self, rid: str, prompt: Sequence[int], params: SamplingParams) -> None:
        params.validate()
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop.update(self.runner.eos_token_ids)
        self.scheduler.add(
            Request(
                rid=rid,
                prompt_len=len(prompt),
                prompt=list(prompt),
                max_new_tokens=params.max_new_tokens,
                arrival=self.now,
                stop_token_ids=frozenset(stop),
            )
        )
        self.requests[rid] = _Tracked(len(prompt), params, list(prompt))

    def step(self) -> list[Event]:
        """One scheduler step run on the model."""
        plan = self.scheduler.schedule(self.now)
        self.now += 1.0
        self.plans.append(plan)
        rids = plan.sampling_rids()
        tracked = self.requests
        inputs = StepInputs(
            prefill_tokens=[
                tracked[c.rid].sequence[c.start : c.start + c.length] for c in plan.prefill
            ],
            decode_tokens=[tracked[d.rid].sequence[d.position] for d in plan.decode],
            sampling=[tracked[rid].params for rid in rids],
            output_index=[len(tracked[rid].output) for rid in rids],
        )
        tokens = self.runner.step(plan, inputs)
        events = self.scheduler.complete(plan, dict(zip(rids, tokens, strict=True)))
        for event in events:
            if isinstance(event, TokenOut):
                tracked[event.rid].output.append(event.token)
                tracked[event.rid].sequence.append(event.token)
            elif isinstance(event, Finished):
                tracked[event.rid].finished = event
        return events

    def run(self) -> dict[str, list[int]]:
        """Step until every request has finished; the output ids of every request so far."""
        while self.scheduler.has_work():
            self.step()
        return {rid: t.output for rid, t in self.requests.items()}
