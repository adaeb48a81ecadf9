"""Room reserved at admission for the decode growth of running requests (the new-token ratio).

A request admitted now will want pages for the tokens it has yet to generate.
Admitting while only counting today's pages fills memory with prompts and then
preempts (recomputes) running requests as they grow. The reservation estimates
those future tokens as ``ratio * min(tokens still to plan, 4096)`` per running
or admitted request, and while anything runs admission keeps that many token
slots free (a request alone is always admitted when its pages fit)::

    admit r  iff  pages(r) * page_size + reserved + ratio * future(r) <= available * page_size

The ratio starts at ``init_new_token_ratio``, falls linearly to
``min_new_token_ratio`` over ``new_token_ratio_decay_steps`` decode steps, and
jumps back to the start after a preemption and whenever nothing is running,
as in SGLang's scheduler. It is a function of an integer step count, so a run
of k decode steps advanced at once lands on exactly the same value.
"""

from __future__ import annotations

from collections.abc import Iterable

from core.scheduler.config import SchedulerConfig
from core.scheduler.request import Request

FUTURE_TOKENS_CLIP = 4096  # a request's estimate counts at most this many future tokens


class DecodeReservation:
    """The new-token ratio and the token slots it reserves; all zero when disabled."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.enabled = config.reserve_decode
        self.init_ratio = config.init_new_token_ratio
        self.min_ratio = config.min_new_token_ratio
        self.decay_steps = config.new_token_ratio_decay_steps
        self.steps = 0  # decode steps since the last reset

    def ratio(self, extra_steps: int = 0) -> float:
        """The ratio now, or after ``extra_steps`` more decode steps."""
        if not self.enabled:
            return 0.0
        fall = (self.init_ratio - self.min_ratio) * (self.steps + extra_steps) / self.decay_steps
        return max(self.min_ratio, self.init_ratio - fall)

    def reset(self) -> None:
        self.steps = 0

    def decayed(self, steps: int = 1) -> None:
        self.steps += steps

    def future(self, req: Request, later: int = 0) -> int:
        """Tokens ``req`` has yet to plan (``later`` steps from now), clipped."""
        return min(max(0, req.max_new_tokens - req.planned_outputs - later), FUTURE_TOKENS_CLIP)

    def tokens(self, reqs: Iterable[Request], later: int = 0) -> float:
        """Token slots reserved for ``reqs``' growth, ``later`` decode steps from now."""
        if not self.enabled:
            return 0.0
        return self.ratio(later) * sum(self.future(r, later) for r in reqs)
