"""The step driver of scheduler rank 0: the shared core plus the model, step by step.

The core (``core.scheduler.Scheduler``) knows keys and pages; this object
keeps what the core does not: each request's token sequence, sampling
parameters, stage timestamps and, when asked for, its prompt log-probs. A step
is two calls:

- ``launch()``: ``schedule`` a plan, build its inputs and start it on the model
  (which returns at once on CUDA);
- ``finish(launched)``: wait for its tokens, ``complete`` the plan and turn the
  core's events into ``TokenItem`` values for the detokenizer.

``step()`` is ``finish(launch())``. With overlap scheduling the loop launches
step N+1 before it finishes step N: a decode slot whose input token step N is
still sampling gets ``FROM_LAST_SAMPLE``, which the model reads on the device.
A step that verifies drafts is finished at once (``advance``).

With a drafter (speculative decoding) the core puts a draft in a decoding
request's slot; the step returns that slot's verified tokens, which the core
appends (rolling back the rest), and the request's token item carries every
token kept. ``speculative`` counts the drafts proposed and accepted. With a
synthetic ``acceptance`` (``engine.speculative.synthetic``) that rule, keyed by
each request's id and output index, decides the accepted drafts instead of the
model.

With a ``StepRecorder`` every step that runs a plan on the model adds a row to
the step record (``engine.scheduler_proc.recorder``).

Prefill/decode roles (``engine.scheduler_proc.pd`` moves the KV): a prefill-role
request the core hands off delivers its first token with no end; its rid waits in
``handed_off`` for the hand-off, whose outcome ends it. A decode-role request
enters with ``add_incoming`` and the first token its prefill server sampled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from core.scheduler import (
    Finished,
    FinishReason,
    Plan,
    Preempted,
    Request,
    RequestRejected,
    Scheduler,
    SchedulerConfig,
    SchedulerStats,
    TokenOut,
)
from engine.ipc import messages
from engine.runner.inputs import FROM_LAST_SAMPLE, PromptLogprobsRequest, StepInputs, StepOutput
from engine.runner.step import StepHandle
from engine.sampling.logprobs import TokenLogprob, first_prompt_entry
from engine.sampling.params import SamplingParams
from engine.sampling.verify import SlotVerifier
from engine.scheduler_proc.drafts import DraftCounters, accepted_tokens
from engine.scheduler_proc.recorder import Launch, StepRecorder

if TYPE_CHECKING:
    from core.scheduler.drafter import Drafter
    from engine.speculative.synthetic import SyntheticAcceptance

log = logging.getLogger(__name__)

LaunchFn = Callable[[Plan, StepInputs], StepHandle]


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


@dataclass(frozen=True, slots=True)
class Launched:
    """A plan on its way through the model."""

    plan: Plan
    handle: StepHandle
    record: Launch | None = None  # what the step record knows of it so far
    verify: SlotVerifier | None = None  # the synthetic acceptance of its drafts, if any


class StepDriver:
    """``add``/``abort`` from messages, ``launch``/``finish`` to advance; never reads sockets."""

    def __init__(
        self,
        config: SchedulerConfig,
        launch: LaunchFn,
        eos_token_ids: Sequence[int],
        recorder: StepRecorder | None = None,
        drafter: Drafter | None = None,
        acceptance: SyntheticAcceptance | None = None,
    ):
        self.core = Scheduler(config, drafter=drafter)
        self.speculative = DraftCounters() if drafter is not None else None
        self.acceptance = acceptance
        self.recorder = recorder
        self._unfinished = 0  # steps launched and not yet finished
        self.run_model = launch
        self.eos_token_ids = frozenset(eos_token_ids)
        self.tracked: dict[str, Tracked] = {}
        self._ended: list[str] = []  # requests that ended since the last launch
        self.handed_off: list[str] = []  # prefill role: handed off, not yet taken for transfer
        self.last_plan: Plan | None = None
        self.num_preemptions = 0

    def add(self, msg: messages.TokenizedRequest) -> messages.TokenItem | None:
        """Queue a tokenized request; an error item if the core rejects it."""
        params = msg.sampling
        scored = params.prompt_logprobs is not None  # computed, never from the prefix cache
        req = self._request(msg, scored)
        try:
            self.core.add(req)
        except RequestRejected as exc:
            log.info("rid %s rejected: %s", msg.rid, exc)
            return rejected(msg.rid, str(exc))
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

    def add_incoming(
        self, msg: messages.TokenizedRequest, first_token: int, finish_reason: str | None = None
    ) -> messages.TokenItem:
        """Decode role: queue ``msg``, whose prompt's KV a prefill server computed and whose
        ``first_token`` it sampled (``core.scheduler.handoff``); the item that delivers that
        token, or an error item if the core rejects the request. With ``finish_reason`` the
        request ended with its first token there: the item ends it, nothing is queued."""
        if finish_reason is None:
            try:
                self.core.add_incoming(self._request(msg, False), first_token)
            except RequestRejected as exc:
                log.info("rid %s rejected: %s", msg.rid, exc)
                return rejected(msg.rid, str(exc))
        now = time.time()
        t = self.tracked[msg.rid] = Tracked(
            sequence=list(msg.input_ids),
            prompt_len=len(msg.input_ids),
            params=msg.sampling,
            received=msg.received,
            tokenized=msg.tokenized,
            first_scheduled=now,
        )
        item = self._token_item(TokenOut(msg.rid, first_token, True), now, None)
        if finish_reason is not None:
            item.finish_reason, item.finished = finish_reason, now
            self.tracked.pop(msg.rid)
        log.debug("rid %s incoming: %d prompt tokens", msg.rid, t.prompt_len)
        return item

    def _request(self, msg: messages.TokenizedRequest, scored: bool) -> Request:
        params = msg.sampling
        stop = set(params.stop_token_ids)
        if not params.ignore_eos:
            stop |= self.eos_token_ids
        return Request(
            rid=msg.rid,
            prompt_len=len(msg.input_ids),
            prompt=() if scored else list(msg.input_ids),
            max_new_tokens=params.max_new_tokens,
            arrival=msg.received,
            stop_token_ids=frozenset(stop),
            priority=msg.priority,
        )

    def abort(self, rid: str, reason: str) -> None:
        if self.core.abort(rid):
            log.info("rid %s aborted: %s", rid, reason)

    def has_work(self) -> bool:
        return self.core.has_work()

    def stats(self) -> SchedulerStats:
        return self.core.stats()

    def inputs(self, plan: Plan) -> StepInputs:
        """Token ids, sampling parameters and output indices of ``plan`` (see ``StepInputs``).

        A sampled row's output index is the index of the token it samples, read off
        its position, so it is right whether or not the step before is still running.
        """
        tracked = self.tracked
        decode_tokens = []
        for d in plan.decode:
            seq = tracked[d.rid].sequence
            decode_tokens.append(seq[d.position] if d.position < len(seq) else FROM_LAST_SAMPLE)
        params: list[SamplingParams] = []
        index: list[int] = []
        for c in plan.prefill:
            if c.samples:
                t = tracked[c.rid]
                params.append(t.params)
                index.append(c.start + c.length - t.prompt_len)
        for d in plan.decode:
            t = tracked[d.rid]
            params.append(t.params)
            index.append(d.position + 1 - t.prompt_len)
        ended, self._ended = self._ended, []
        prompt = [tracked[c.rid].prompt_logprobs_request(c.start, c.length) for c in plan.prefill]
        return StepInputs(
            prefill_tokens=[
                tracked[c.rid].sequence[c.start : c.start + c.length] for c in plan.prefill
            ],
            decode_tokens=decode_tokens,
            sampling=params,
            output_index=index,
            prompt_logprobs=prompt if any(r is not None for r in prompt) else [],
            released=ended,
        )

    def launch(self) -> Launched:
        """Schedule a plan and start it on the model (without waiting for its tokens)."""
        counts = (self.core.num_waiting, self.core.num_running)
        now = time.time()
        plan = self.core.schedule(now)
        self.last_plan = plan
        started = time.time()
        for chunk in plan.prefill:
            t = self.tracked[chunk.rid]
            if t.first_scheduled is None:
                t.first_scheduled = started
                req = self.core.get(chunk.rid)
                t.cached_tokens = req.num_cached if req is not None else 0
        in_flight = self._unfinished > 0
        self._unfinished += 1
        if not plan.has_model_work:
            return Launched(plan, StepHandle(None))
        inputs = self.inputs(plan)
        handle = self.run_model(plan, inputs)
        verify = None
        if self.acceptance is not None and plan.num_draft_tokens:
            verify = self.acceptance.verifier(plan.sampling_rids(), inputs.output_index)
        if self.recorder is None:
            return Launched(plan, handle, verify=verify)
        launched = time.time()
        enqueued = launched if handle.enqueued is None else handle.enqueued
        times = (now, started, enqueued, launched)
        return Launched(plan, handle, Launch.of(plan, times, in_flight, counts), verify)

    def finish(self, launched: Launched) -> list[messages.TokenItem]:
        """Wait for ``launched``'s tokens and apply them; the token items, one per request."""
        plan = launched.plan
        self._unfinished -= 1
        out = launched.handle.result(launched.verify)
        self._keep_prompt_logprobs(plan, out)
        rids = plan.sampling_rids()
        tokens = dict(zip(rids, out.tokens, strict=False))
        logprobs = dict(zip(rids, out.logprobs, strict=False))
        accepted: list[int] = []
        if self.speculative is not None:
            accepted = accepted_tokens(plan, tokens)
            self.speculative.count(plan, accepted)
        done = time.time()
        items: dict[str, messages.TokenItem] = {}
        for event in self.core.complete(plan, tokens):
            if isinstance(event, TokenOut):
                self._on_token(items, event, done, logprobs.get(event.rid))
            elif isinstance(event, Finished):
                if event.reason is FinishReason.HANDOFF:  # it ends with its transfer
                    self.handed_off.append(event.rid)
                    self._forget(event.rid, event)
                    continue
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
        if self.recorder is not None and launched.record is not None:
            self.recorder.add(
                launched.record, time.time(), launched.handle.device_ms(), sum(accepted)
            )
        return list(items.values())

    def step(self) -> list[messages.TokenItem]:
        """One step, start to end."""
        return self.finish(self.launch())

    def advance(
        self, in_flight: Launched | None, overlap: bool
    ) -> tuple[list[messages.TokenItem], Launched | None, bool]:
        """One iteration of the scheduler loop: launch the next step, then finish the one in
        flight; with ``overlap`` a launched step with model work stays in flight, unless it
        verifies drafts: that one is finished before the next step is formed, so every
        decoding request can be placed in the next (a request whose draft is in flight would
        sit it out, and the running requests could split into groups verifying in turn).

        Returns the token items, the step now in flight, and whether the loop is stalled
        (work exists but nothing could run, e.g. every waiting request lacks KV pages).
        """
        launched = self.launch() if self.has_work() else None
        items = self.finish(in_flight) if in_flight is not None else []
        if launched is None:
            return items, None, False
        if overlap and launched.plan.has_model_work and not launched.plan.num_draft_tokens:
            return items, launched, False
        produced = self.finish(launched)
        stalled = not launched.plan.has_model_work and not produced
        return items + produced, None, stalled

    def _keep_prompt_logprobs(self, plan: Plan, out: StepOutput) -> None:
        for chunk, entries in zip(plan.prefill, out.prompt_logprobs, strict=False):
            t = self.tracked.get(chunk.rid)
            if entries and t is not None and t.prompt_logprobs is not None:
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

    def _on_token(
        self,
        items: dict[str, messages.TokenItem],
        event: TokenOut,
        now: float,
        entries: list[TokenLogprob] | None,
    ) -> None:
        """Put ``event``'s token on its request's item of this step; a slot that verified a
        draft delivers several, ``entries`` holding their log-probs in order."""
        item = items.get(event.rid)
        entry = entries[len(item.token_ids) if item else 0] if entries else None
        if item is None:
            items[event.rid] = self._token_item(event, now, entry)
            return
        t = self.tracked[event.rid]
        t.sequence.append(event.token)
        t.num_output += 1
        item.token_ids.append(event.token)
        item.token_times.append(now)
        if entry is not None:
            item.logprobs.append(entry)

    def _forget(self, rid: str, event: Finished) -> None:
        self._ended.append(rid)
        t = self.tracked.pop(rid, None)
        if t is not None:
            log.debug("rid %s finished (%s) after %d tokens", rid, event.reason.value, t.num_output)


def rejected(rid: str, why: str, status: int = 400) -> messages.TokenItem:
    """The item that ends ``rid`` with the error ``why`` (HTTP ``status``)."""
    return messages.TokenItem(
        rid=rid, token_ids=[], token_times=[], finish_reason="error", error=why, error_status=status
    )
