"""Speculative decoding's verification: which draft tokens the target model keeps.

A decode slot with a draft ``d_0 .. d_{k-1}`` feeds its known token and the
draft at ``k + 1`` positions; the model's logits at position ``i`` give ``p_i``,
the target's distribution of the token after it (after temperature, top-k and
top-p, as the sampler applies them). The sampler draws one token ``t_i`` per
position, exactly as plain decoding would draw it there: the argmax for greedy
rows, else ``argmax(p_i / E)`` with ``E ~ Exp(1)`` noise (per-request seeds key
the noise by output index, as in plain decoding). Then::

    accept d_i while t_i == d_i;  verified = t_0 .. t_m  (m: the first i with t_i != d_i, else k)

This is the standard rejection rule for a deterministic (one-hot) draft:

- the exponential race picks ``d_i`` with probability ``p_i(d_i)``: the draft
  is accepted with probability ``p_i(d_i)`` (``min(1, p / q)`` with ``q = 1``);
- given that it did not pick ``d_i``, it picks ``x`` with probability
  ``p_i(x) / (1 - p_i(d_i))``: the correction is ``p_i`` with ``d_i`` removed
  and renormalized (``max(0, p - q)``, normalized);
- after ``k`` acceptances ``t_k`` is a plain draw from ``p_k``: the bonus token.

So every verified token has the target's distribution given the tokens before
it; greedy output is the plain greedy output, and a seeded request draws the
same tokens with or without a draft (the noise at output index ``j`` is the
same), up to the logits' rounding in a batch of another shape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine.sampling.params import SamplingParams

Verified = int | list[int]
"""A sampled request's tokens from one step: an int without a draft, else the verified list."""
SlotVerifier = Callable[[int, Sequence[int], Sequence[int]], list[int]]
"""Another acceptance rule (``engine.speculative.synthetic``): ``(i, sampled, draft)`` -> the
verified tokens of the ``i``-th request of the step, from its ``len(draft) + 1`` sampled."""


def verify_draft(sampled: Sequence[int], draft: Sequence[int]) -> list[int]:
    """The verified tokens of a slot: ``sampled`` (``len(draft) + 1`` tokens, one drawn after
    each fed position) up to and including the first that differs from the draft's token at
    its position, or all of them."""
    if len(sampled) != len(draft) + 1:
        raise ValueError(f"{len(sampled)} sampled tokens for a draft of {len(draft)}")
    for i, token in enumerate(draft):
        if sampled[i] != token:
            return list(sampled[: i + 1])
    return list(sampled)


def row_counts(drafts: Sequence[Sequence[int]]) -> list[int]:
    """Sampled rows per request: one, plus one per draft token."""
    return [len(d) + 1 for d in drafts]


def expand_rows(
    params: Sequence[SamplingParams],
    output_index: Sequence[int],
    drafts: Sequence[Sequence[int]],
) -> tuple[list[SamplingParams], list[int]]:
    """Per sampled row, the parameters and output index: a request's draft rows repeat its
    parameters, and row ``j`` of it draws output ``output_index + j``."""
    if not any(drafts):
        return list(params), list(output_index)
    rows: list[SamplingParams] = []
    index: list[int] = []
    for p, first, n in zip(params, output_index, row_counts(drafts), strict=True):
        rows.extend([p] * n)
        index.extend(range(first, first + n))
    return rows, index


def group_tokens(
    flat: Sequence[int], drafts: Sequence[Sequence[int]], verify: SlotVerifier | None = None
) -> list[Verified]:
    """Per request (``drafts`` one entry each, empty without a draft), from the tokens of every
    sampled row in order: the token, or the verified tokens of a slot with a draft (by
    ``verify``, else ``verify_draft``)."""
    out: list[Verified] = []
    row = 0
    for i, draft in enumerate(drafts):
        if draft:
            sampled = flat[row : row + len(draft) + 1]
            out.append(
                verify_draft(sampled, draft) if verify is None else verify(i, sampled, draft)
            )
        else:
            out.append(int(flat[row]))
        row += len(draft) + 1
    if row != len(flat):
        raise ValueError(f"{len(flat)} sampled rows for {row} rows of drafts")
    return out


def kept_rows(drafts: Sequence[Sequence[int]], tokens: Sequence[Verified]) -> list[list[int]]:
    """Per request, the sampled rows (indices into every row in order) of its kept tokens:
    its first row, or the first ``len(verified)`` rows of a slot with a draft."""
    out: list[list[int]] = []
    row = 0
    for draft, kept in zip(drafts, tokens, strict=True):
        n = len(kept) if isinstance(kept, list) else 1
        out.append(list(range(row, row + n)))
        row += len(draft) + 1
    return out
