"""The token-level inputs and outputs of one step, alongside its ``Plan`` (wire types, msgpack)."""

from __future__ import annotations

import msgspec

from engine.sampling.logprobs import TokenLogprob
from engine.sampling.params import SamplingParams


class PromptLogprobsRequest(msgspec.Struct, array_like=True):
    """Prompt log-probs wanted from one prefill chunk: row ``i`` of the chunk scores
    ``targets[i]`` (the prompt token after it), with ``num_top`` alternatives."""

    targets: list[int]
    num_top: int


class StepInputs(msgspec.Struct):
    """What the scheduler process knows about a plan's tokens.

    ``prefill_tokens[i]`` are the ids of ``plan.prefill[i]`` (its span of prompt
    plus output); ``decode_tokens[j]`` is the input id of ``plan.decode[j]`` (the
    request's last token). ``sampling`` and ``output_index`` follow
    ``plan.sampling_rids()``; ``output_index`` counts tokens generated so far and
    feeds per-request seeds. ``prompt_logprobs`` follows ``plan.prefill`` (None
    where a chunk wants none); empty when no chunk does.
    """

    prefill_tokens: list[list[int]]
    decode_tokens: list[int]
    sampling: list[SamplingParams]
    output_index: list[int]
    prompt_logprobs: list[PromptLogprobsRequest | None] = []


class StepOutput(msgspec.Struct):
    """What one step produced on rank 0.

    ``tokens`` follows ``plan.sampling_rids()``, and so does ``logprobs`` (None
    where the request asked for none; empty when none did). ``prompt_logprobs``
    follows ``plan.prefill`` like ``StepInputs.prompt_logprobs``.
    """

    tokens: list[int]
    logprobs: list[TokenLogprob | None] = []
    prompt_logprobs: list[list[TokenLogprob] | None] = []
