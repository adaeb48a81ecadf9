"""The token-level inputs of one step, alongside its ``Plan`` (a wire type, msgpack)."""

from __future__ import annotations

import msgspec

from engine.sampling.params import SamplingParams


class StepInputs(msgspec.Struct):
    """What the scheduler process knows about a plan's tokens.

    ``prefill_tokens[i]`` are the ids of ``plan.prefill[i]`` (its span of prompt
    plus output); ``decode_tokens[j]`` is the input id of ``plan.decode[j]`` (the
    request's last token). ``sampling`` and ``output_index`` follow
    ``plan.sampling_rids()``; ``output_index`` counts tokens generated so far and
    feeds per-request seeds.
    """

    prefill_tokens: list[list[int]]
    decode_tokens: list[int]
    sampling: list[SamplingParams]
    output_index: list[int]
