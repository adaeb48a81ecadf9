"""The token-level inputs of one step, alongside its ``Plan`` (a wire type, msgpack)."""

from __future__ import annotations

import msgspec

from engine.sampling.params import SamplingParams

FROM_LAST_SAMPLE = -1
"""A decode input id that stands for the token the previous step sampled for the request."""


class StepInputs(msgspec.Struct):
    """What the scheduler process knows about a plan's tokens.

    ``prefill_tokens[i]`` are the ids of ``plan.prefill[i]`` (its span of prompt
    plus output); ``decode_tokens[j]`` is the input id of ``plan.decode[j]`` (the
    request's last token), or ``FROM_LAST_SAMPLE`` when that token is still being
    sampled by the step launched just before (overlap scheduling). ``sampling``
    and ``output_index`` follow ``plan.sampling_rids()``; ``output_index`` counts
    tokens generated so far and feeds per-request seeds. ``released`` names the
    requests that ended since the previous step, so the runner drops their state.
    """

    prefill_tokens: list[list[int]]
    decode_tokens: list[int]
    sampling: list[SamplingParams]
    output_index: list[int]
    released: list[str] = msgspec.field(default_factory=list)
