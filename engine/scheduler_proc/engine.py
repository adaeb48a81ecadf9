"""The engine of scheduler rank 0: the shared core plus the model, one step at a time.

The core (``engine.scheduler.Scheduler``) knows keys and pages; this object
keeps what the core does not: each request's token sequence, sampling
parameters, stage timestamps and, when asked for, its prompt log-probs.
``step`` runs ``schedule -> model -> complete`` and turns the core's events
into ``TokenItem`` values for the detokenizer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from engine import messages
from engine.runner.inputs import PromptLogprobsRequest, StepInputs, StepOutput
from engine.sampling.logprobs import TokenLogprob, first_prompt_entry
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

StepFn = Callable[[Plan, StepInputs], StepOutput]


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
    prompt_logprobs: list[TokenLogprob | None] | None = None  # by prompt position, when asked

    def prompt_logprobs_request(self, start: int, length: int) -> PromptLogprobsRequest | None:
        """What a prefill chunk over ``[start, start + length)`` must score, if anything.

        Only before the first output token: a recompute after a preemption then
        scores the same positions again (and overwrites them).
        """
        k = self.params.prompt_logprobs
        if self.prompt_logprobs is None or k is None or self.num_output:
            return None
        end = min(start + length, self.prompt_len - 1)
        return PromptLogprobsRequest(self.sequence[start + 1 : end + 1], k)


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
        scored = params.prompt_logprobs is not None  # computed, never from the prefix cache
        req = Request(
            rid=msg.rid,
            prompt_len=len(msg.input_ids),
            prompt=() if scored else list(msg.input_ids),
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
        if scored:
            entries = [first_prompt_entry(msg.input_ids[0])]
            self.tracked[msg.rid].prompt_logprobs = entries + [None] * (len(msg.input_ids) - 1)
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
        prompt = [tracked[c.rid].prompt_logprobs_request(c.start, c.length) for c in plan.prefill]
        return StepInputs(
            prefill_tokens=[
                tracked[c.rid].sequence[c.start : c.start + c.length] for c in plan.prefill
            ],
            decode_tokens=[tracked[d.rid].sequence[d.position] for d in plan.decode],
            sampling=[tracked[rid].params for rid in rids],
            output_index=[tracked[rid].num_output for rid in rids],
            prompt_logprobs=prompt if any(r is not None for r in prompt) else [],
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
        out = StepOutput([])
        if plan.has_model_work:
            out = self.run_step(plan, self.inputs(plan))
            self._keep_prompt_logprobs(plan, out)
        rids = plan.sampling_rids()
        tokens = dict(zip(rids, out.tokens, strict=True))
        logprobs = dict(zip(rids, out.logprobs, strict=False))
        done = time.time()
        items: dict[str, messages.TokenItem] = {}
        for event in self.core.complete(plan, tokens):
            if isinstance(event, TokenOut):
                items[event.rid] = self._token_item(event, done, logprobs.get(event.rid))
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

    def _keep_prompt_logprobs(self, plan: Plan, out: StepOutput) -> None:
        for chunk, entries in zip(plan.prefill, out.prompt_logprobs, strict=False):
            t = self.tracked[chunk.rid]
            if entries and t.prompt_logprobs is not None:
                t.prompt_logprobs[chunk.start + 1 : chunk.start + 1 + len(entries)] = entries

    def _token_item(
        self, event: TokenOut, now: float, logprob: TokenLogprob | None
    ) -> messages.TokenItem:
        t = self.tracked[event.rid]
        t.sequence.append(event.token)
        t.num_output += 1
        item = messages.TokenItem(rid=event.rid, token_ids=[event.token], token_times=[now])
        if logprob is not None:
            item.logprobs = [logprob]
        if event.first and t.prompt_logprobs is not None:
            item.prompt_logprobs = [e for e in t.prompt_logprobs if e is not None]
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
