"""The engine of scheduler rank 0: the shared core plus the model, one step at a time.

The core (``engine.scheduler.Scheduler``) knows keys and pages; this object
keeps what the core does not: each request's token sequence, sampling
parameters and stage timestamps. ``step`` runs ``schedule -> model ->
complete`` and turns the core's events into ``TokenItem`` values for the
detokenizer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine import messages
from engine.runner.inputs import StepInputs
from engine.sampling.params import SamplingParams
from engine.scheduler import (
    Finished,
    Plan,
    Preempted,
    Request,
    RequestRejected,
    Scheduler,
    SchedulerConfig,
    SchedulerStats,
    TokenOut,
)

log = logging.getLogger(__name__)

StepFn = Callable[[Plan, StepInputs], Sequence[int]]


@dataclass
class Tracked:
    """What the engine knows of one live request beyond the core's view."""

    sequence: list[int]  # prompt, then output tokens
    prompt_len: int
    params: SamplingParams
    received: float
    tokenized: float
    first_scheduled: float | None = None
    cached_tokens: int = 0
    num_output: int = 0
    token_times: list[float] = field(default_factory=list)


class Engine:
    """``add``/``abort`` from messages, ``step`` to advance; never reads sockets."""

    def __init__(self, config: SchedulerConfig, run_step: StepFn, eos_token_ids: Sequence[int]):
        self.core = Scheduler(config)
        self.run_step = run_step
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tracked: dict[str, Tracked] = {}
        self.last_plan: Plan | None = None
        self.num_preemptions = 0

    def add(self, msg: messages.TokenizedRequest) -> messages.TokenItem | None:
        """Queue a tokenized request; an error item if the core rejects it."""
        params = msg.sampling
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        req = Request(
            rid=msg.rid,
            prompt_len=len(msg.input_ids),
            prompt=list(msg.input_ids),
            max_new_tokens=params.max_new_tokens,
            arrival=msg.received,
            stop_token_ids=frozenset(stop),
            priority=msg.priority,
        )
        try:
            self.core.add(req)
        except RequestRejected as exc:
            log.info("rid %s rejected: %s", msg.rid, exc)
            return messages.TokenItem(
                rid=msg.rid, token_ids=[], token_times=[], finish_reason="error", error=str(exc)
            )
        self.tracked[msg.rid] = Tracked(
            sequence=list(msg.input_ids),
            prompt_len=len(msg.input_ids),
            params=params,
            received=msg.received,
            tokenized=msg.tokenized,
        )
        log.debug("rid %s queued: %d prompt tokens", msg.rid, len(msg.input_ids))
        return None

    def abort(self, rid: str, reason: str) -> None:
        if self.core.abort(rid):
            log.info("rid %s aborted: %s", rid, reason)

    def has_work(self) -> bool:
        return self.core.has_work()

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def inputs(self, plan: Plan) -> StepInputs:
        tracked = self.tracked
        rids = plan.sampling_rids()
        return StepInputs(
            prefill_tokens=[
                tracked[c.rid].sequence[c.start : c.start + c.length] for c in plan.prefill
            ],
            decode_tokens=[tracked[d.rid].sequence[d.position] for d in plan.decode],
            sampling=[tracked[rid].params for rid in rids],
            output_index=[tracked[rid].num_output for rid in rids],
        )

    def step(self) -> list[messages.TokenItem]:
        """One scheduler step on the model; the token items it produced, one per request."""
        plan = self.core.schedule(time.time())
        self.last_plan = plan
        started = time.time()
        for chunk in plan.prefill:
            t = self.tracked[chunk.rid]
            if t.first_scheduled is None:
                t.first_scheduled = started
                req = self.core.get(chunk.rid)
                t.cached_tokens = req.num_cached if req is not None else 0
        tokens: dict[str, int] = {}
        if plan.has_model_work:
            rids = plan.sampling_rids()
            sampled = self.run_step(plan, self.inputs(plan))
            tokens = dict(zip(rids, sampled, strict=True))
        done = time.time()
        items: dict[str, messages.TokenItem] = {}
        for event in self.core.complete(plan, tokens):
            if isinstance(event, TokenOut):
                items[event.rid] = self._token_item(event, done)
            elif isinstance(event, Finished):
                item = items.get(event.rid)
                if item is None:
                    item = items[event.rid] = messages.TokenItem(
                        rid=event.rid, token_ids=[], token_times=[]
                    )
                item.finish_reason = event.reason.value
                item.finished = done
                self._forget(event.rid, event)
            elif isinstance(event, Preempted):
                self.num_preemptions += 1
                log.info("rid %s preempted (KV pages ran out); it will recompute", event.rid)
        return list(items.values())

    def _token_item(self, event: TokenOut, now: float) -> messages.TokenItem:
        t = self.tracked[event.rid]
        t.sequence.append(event.token)
        t.num_output += 1
        item = messages.TokenItem(rid=event.rid, token_ids=[event.token], token_times=[now])
        if event.first:
            item.stop = list(t.params.stop)
            item.prompt_tokens = t.prompt_len
            item.cached_tokens = t.cached_tokens
            item.tokenized = t.tokenized
            item.first_scheduled = t.first_scheduled
        return item

    def _forget(self, rid: str, event: Finished) -> None:
        t = self.tracked.pop(rid, None)
        if t is not None:
            log.debug("rid %s finished (%s) after %d tokens", rid, event.reason.value, t.num_output)
