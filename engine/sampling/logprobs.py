"""Log-probabilities of chosen tokens and their top alternatives, from float32 logits.

Pure functions on a logits tensor ``[rows, vocab]``: the runner calls them on
the rows it sampled (``sampled_logprobs``) and on the prompt rows of a
request that asked for prompt log-probabilities (``prompt_logprobs``). Values
are ``log_softmax`` of the model's logits: the distribution before
temperature, top-k and top-p, as OpenAI and vLLM report it.

Row ``i`` of a prefill predicts the token at position ``i + 1``; a prompt's
first token has no row that predicts it, so its entry has ``logprob`` None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

if TYPE_CHECKING:
    import torch  # not at run time: the frontend process reads these structs without torch


class TokenLogprob(msgspec.Struct, array_like=True, frozen=True):
    """One position: its token, the token's log-probability, and the top alternatives.

    ``top_ids``/``top_logprobs`` are the most likely tokens at the position,
    best first (as many as were asked for); ``logprob`` is None only for the
    first token of a prompt.
    """

    token_id: int
    logprob: float | None
    top_ids: list[int] = []
    top_logprobs: list[float] = []


def _entries(logits: torch.Tensor, targets: Sequence[int], num_top: int) -> list[TokenLogprob]:
    """Entries of the first ``len(targets)`` rows of ``logits``, with ``num_top`` alternatives."""
    import torch

    n = len(targets)
    if n == 0:
        return []
    logprobs = torch.log_softmax(logits[:n].float(), dim=-1)
    index = torch.tensor(list(targets), dtype=torch.int64, device=logits.device)
    chosen = logprobs.gather(1, index[:, None])[:, 0].tolist()
    if num_top > 0:
        values, ids = logprobs.topk(min(num_top, logprobs.shape[-1]), dim=-1)
        top_values, top_ids = values.tolist(), ids.tolist()
    else:
        top_values, top_ids = [[] for _ in range(n)], [[] for _ in range(n)]
    return [
        TokenLogprob(int(t), float(lp), top_ids[i], top_values[i])
        for i, (t, lp) in enumerate(zip(targets, chosen, strict=True))
    ]


def sampled_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], num_top: Sequence[int | None]
) -> list[TokenLogprob | None]:
    """For each row: the entry of its sampled token with ``num_top[row]`` alternatives, or None
    where ``num_top[row]`` is None (the request asked for no log-probabilities)."""
    out: list[TokenLogprob | None] = [None] * len(tokens)
    import torch

    wanted = [i for i, k in enumerate(num_top) if k is not None]
    for k in sorted({num_top[i] or 0 for i in wanted}):
        rows = [i for i in wanted if (num_top[i] or 0) == k]
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        for i, entry in zip(
            rows, _entries(logits[index], [tokens[i] for i in rows], k), strict=True
        ):
            out[i] = entry
    return out


def prompt_logprobs(
    logits: torch.Tensor, targets: Sequence[int], num_top: int
) -> list[TokenLogprob]:
    """Entries for prompt positions predicted by the rows of ``logits``: row ``i`` scores
    ``targets[i]`` (the prompt token that follows it); rows past ``len(targets)`` are unused."""
    return _entries(logits, targets, num_top)


def first_prompt_entry(token_id: int) -> TokenLogprob:
    """The entry of a prompt's first token, which nothing predicts."""
    return TokenLogprob(token_id, None)
