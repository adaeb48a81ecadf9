"""The token-level inputs and outputs of one step, alongside its ``Plan`` (wire types, msgpack)."""

from __future__ import annotations

import msgspec

from engine.sampling.logprobs import TokenLogprob
from engine.sampling.params import SamplingParams

FROM_LAST_SAMPLE = -1
"""A decode input id that stands for the token the previous step sampled for the request."""


class PromptLogprobsRequest(msgspec.Struct, array_like=True):
    """Prompt log-probs wanted from one prefill chunk: row ``i`` of the chunk scores
    ``targets[i]`` (the prompt token after it), with ``num_top`` alternatives."""

    targets: list[int]
    num_top: int


class StepInputs(msgspec.Struct):
    """What the scheduler process knows about a plan's tokens.

    ``prefill_tokens[i]`` are the ids of ``plan.prefill[i]`` (its span of prompt
    plus output); ``decode_tokens[j]`` is the input id of ``plan.decode[j]`` (the
    request's last token), or ``FROM_LAST_SAMPLE`` when that token is still being
    sampled by the step launched just before (overlap scheduling). ``sampling``
    and ``output_index`` follow ``plan.sampling_rids()``; ``output_index`` is the
    index of the output token each row samples and feeds per-request seeds.
    ``prompt_logprobs`` follows ``plan.prefill`` (None where a chunk wants none;
    empty when no chunk does). ``released`` names the requests that ended since
    the previous step, so the runner drops their state.
    """

    prefill_tokens: list[list[int]]
    decode_tokens: list[int]
    sampling: list[SamplingParams]
    output_index: list[int]
    prompt_logprobs: list[PromptLogprobsRequest | None] = msgspec.field(default_factory=list)
    released: list[str] = msgspec.field(default_factory=list)


class StepOutput(msgspec.Struct):
    """What one step produced.

    ``tokens`` follows ``plan.sampling_rids()``: the sampled token, or for a
    decode slot with a draft the list of its verified tokens (the accepted draft
    prefix, then the model's next token), as ``Scheduler.complete`` takes them.
    ``logprobs`` follows it too, one entry per token (None where the request
    asked for none; empty when none did). ``prompt_logprobs`` follows
    ``plan.prefill`` like ``StepInputs.prompt_logprobs``.
    """

    tokens: list[int | list[int]]
    logprobs: list[list[TokenLogprob] | None] = msgspec.field(default_factory=list)
    prompt_logprobs: list[list[TokenLogprob] | None] = msgspec.field(default_factory=list)
