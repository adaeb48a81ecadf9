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
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class PendingLogprobs:
    """Log-probabilities of some rows, computed on the device and read by the host later.

    Row ``i`` scored one token; ``num_top[i]`` of the ``top_*`` columns are its
    alternatives. ``to_host`` queues their copy into pinned host memory, so that reading
    them later waits for that copy only: ``entries`` on device tensors copies from the
    device, which waits for everything queued since, the next step included.
    """

    num_top: list[int]
    chosen: torch.Tensor  # float32 [R]
    top_values: torch.Tensor  # float32 [R, K]
    top_ids: torch.Tensor  # int64 [R, K]

    def to_host(self) -> PendingLogprobs:
        """The same log-probs in pinned host memory, copied without waiting (CUDA tensors; on
        the host already, itself): read them once an event recorded after this call is done."""
        if not self.chosen.is_cuda:
            return self
        import torch

        def pinned(t: torch.Tensor) -> torch.Tensor:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
            return host.copy_(t, non_blocking=True)

        return PendingLogprobs(
            self.num_top, pinned(self.chosen), pinned(self.top_values), pinned(self.top_ids)
        )

    def entries(self, tokens: Sequence[int]) -> list[TokenLogprob]:
        """The entries of the rows, ``tokens[i]`` being the token row ``i`` scored."""
        chosen = self.chosen.tolist()
        values, ids = self.top_values.tolist(), self.top_ids.tolist()
        return [
            TokenLogprob(int(t), float(lp), ids[i][:k], values[i][:k])
            for i, (t, lp, k) in enumerate(zip(tokens, chosen, self.num_top, strict=True))
        ]


def pending_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, num_top: Sequence[int]
) -> PendingLogprobs:
    """Log-probs of ``tokens[i]`` under row ``i`` of ``logits`` ``[R, vocab]`` and the
    ``num_top[i]`` most likely tokens, all on the device (nothing waits for it)."""
    import torch

    logprobs = torch.log_softmax(logits.float(), dim=-1)
    chosen = logprobs.gather(1, tokens[:, None].long())[:, 0]
    k = min(max(num_top, default=0), logprobs.shape[-1])
    if k:
        values, ids = logprobs.topk(k, dim=-1)
    else:
        values = logprobs.new_empty((logprobs.shape[0], 0))
        ids = torch.empty((logprobs.shape[0], 0), dtype=torch.int64, device=logprobs.device)
    return PendingLogprobs(list(num_top), chosen, values, ids)


def sampled_logprobs(
    logits: torch.Tensor, tokens: Sequence[int], num_top: Sequence[int | None]
) -> list[TokenLogprob | None]:
    """For each row: the entry of its sampled token with ``num_top[row]`` alternatives, or None
    where ``num_top[row]`` is None (the request asked for no log-probabilities)."""
    import torch

    out: list[TokenLogprob | None] = [None] * len(tokens)
    rows = [i for i, k in enumerate(num_top) if k is not None]
    if rows:
        index = torch.tensor(rows, dtype=torch.int64, device=logits.device)
        chosen = torch.tensor([tokens[i] for i in rows], device=logits.device)
        pending = pending_logprobs(logits[index], chosen, [num_top[i] or 0 for i in rows])
        for i, entry in zip(rows, pending.entries([tokens[i] for i in rows]), strict=True):
            out[i] = entry
    return out


def prompt_logprobs(
    logits: torch.Tensor, targets: Sequence[int], num_top: int
) -> list[TokenLogprob]:
    """Entries for prompt positions predicted by the rows of ``logits``: row ``i`` scores
    ``targets[i]`` (the prompt token that follows it); rows past ``len(targets)`` are unused."""
    import torch

    n = len(targets)
    if n == 0:
        return []
    target = torch.tensor(list(targets), dtype=torch.int64, device=logits.device)
    return pending_logprobs(logits[:n], target, [num_top] * n).entries(targets)


def first_prompt_entry(token_id: int) -> TokenLogprob:
    """The entry of a prompt's first token, which nothing predicts."""
    return TokenLogprob(token_id, None)
