"""A launched step: its results on the device, and their way back to the host.

``StepHandle.result()`` waits for the copy of the step's tokens and the log-probs
its requests asked for into pinned host memory (a CUDA event) and keeps the
verified tokens of each slot with a draft (``engine.sampling.verify``), so a
caller can launch step N+1 before it reads step N's results: nothing it reads
comes from the device, which would wait for step N+1 too. On CPU the step
has already run when it is launched. A handle given the CUDA event that opened
the step's device work times it: ``device_ms()`` once its tokens are read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.runner.inputs import StepOutput
from engine.sampling.logprobs import PendingLogprobs, TokenLogprob
from engine.sampling.verify import SlotVerifier, group_tokens, kept_rows


def recorded_event(timing: bool = False) -> torch.cuda.Event:
    """A CUDA event recorded on the current stream now (``timing``: one that can be timed)."""
    event = torch.cuda.Event(enable_timing=timing)  # type: ignore[no-untyped-call]
    event.record()
    return event


@dataclass(frozen=True, slots=True)
class StepLogprobs:
    """The log-probs a step computes on the device: of the sampled ``rows`` (indices of the
    step's sampled rows: one per request of ``plan.sampling_rids()``, one per fed position of
    a slot with a draft), and per prefill chunk the prompt targets it scored."""

    rows: list[int] = field(default_factory=list)
    sampled: PendingLogprobs | None = None
    prompt: list[tuple[list[int], PendingLogprobs] | None] = field(default_factory=list)

    def to_host(self) -> StepLogprobs:
        """Every part copied to pinned host memory without waiting (``PendingLogprobs.to_host``)."""
        return StepLogprobs(
            self.rows,
            None if self.sampled is None else self.sampled.to_host(),
            [None if p is None else (p[0], p[1].to_host()) for p in self.prompt],
        )


class StepHandle:
    def __init__(
        self,
        sampled: torch.Tensor | None,
        logprobs: StepLogprobs | None = None,
        started: torch.cuda.Event | None = None,
        enqueued: float | None = None,
        drafts: list[tuple[int, ...]] | None = None,
    ) -> None:
        """``sampled``: the tokens of the step's sampled rows on the device (None for a step
        without model work); ``started``: a timing event recorded where the step's device work
        began, if timed; ``enqueued``: when (epoch seconds) the host began handing that work to
        the device; ``drafts``: per request of ``plan.sampling_rids()`` its draft (None: none
        has one), whose rows ``sampled`` holds one per fed position."""
        self.sampled = sampled
        self.logprobs = logprobs
        self.enqueued = enqueued
        self.drafts = drafts if drafts and any(drafts) else None
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        self.timing: tuple[torch.cuda.Event, torch.cuda.Event] | None = None
        if sampled is not None and sampled.is_cuda:
            self._host = torch.empty(sampled.shape, dtype=sampled.dtype, pin_memory=True)
            self._host.copy_(sampled, non_blocking=True)
            # log-probs are read from pinned copies after the event: read from the device,
            # they would wait for every step launched since
            if logprobs is not None:
                self.logprobs = logprobs.to_host()
            self._event = recorded_event(timing=started is not None)
            if started is not None:
                self.timing = (started, self._event)

    def done(self) -> bool:
        """Whether ``result()`` would return without waiting for the device."""
        return self._event is None or bool(self._event.query())  # type: ignore[no-untyped-call]

    def tokens(self) -> list[int]:
        """The tokens of the sampled rows, in the order of ``plan.sampling_rids()`` (a request
        with a draft: one per fed position, verified or not)."""
        if self.sampled is None:
            return []
        if self._event is not None and self._host is not None:
            self._event.synchronize()
            return [int(t) for t in self._host.tolist()]
        return [int(t) for t in self.sampled.tolist()]

    def device_ms(self) -> float | None:
        """Milliseconds from the start of the step's device work to its tokens in host memory;
        None when the step was not timed. Read it after ``tokens()`` (it does not wait)."""
        if self.timing is None:
            return None
        start, end = self.timing
        return float(start.elapsed_time(end))

    def result(self, verify: SlotVerifier | None = None) -> StepOutput:
        """Tokens (a slot with a draft: its verified tokens, by ``verify`` when given, else the
        standard rule) and log-probs (waits for the device)."""
        flat = self.tokens()
        tokens = flat if self.drafts is None else group_tokens(flat, self.drafts, verify)
        lp = self.logprobs
        if lp is None:
            return StepOutput(list(tokens))
        sampled: list[list[TokenLogprob] | None] = []
        if lp.sampled is not None:
            by_row: list[TokenLogprob | None] = [None] * len(flat)
            for i, entry in zip(
                lp.rows, lp.sampled.entries([flat[i] for i in lp.rows]), strict=True
            ):
                by_row[i] = entry
            drafts = self.drafts or [()] * len(tokens)
            for rows in kept_rows(drafts, tokens):
                kept = [by_row[r] for r in rows]
                sampled.append(None if None in kept else [e for e in kept if e is not None])
        prompt = [None if p is None else p[1].entries(p[0]) for p in lp.prompt]
        return StepOutput(list(tokens), sampled, prompt)
