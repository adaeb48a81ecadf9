"""Batched next-token sampling: greedy, temperature, top-k and top-p, per-request seeds.

Only the first ``vocab_limit`` ids are ever drawn (the other logits are cut
off first), so a model whose vocabulary outgrows its tokenizer yields only ids
the tokenizer can decode. Greedy rows take the argmax. The others are scaled
by their temperature, filtered by top-k then top-p, and drawn by the
exponential-race trick (``argmax(p / E)`` with ``E ~ Exp(1)``, equivalent to
drawing from ``p``). A row with a seed draws its noise from a generator seeded
by (seed, output index), so its token does not depend on what else is in the
batch; rows without a seed share the sampler's own generator.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from engine.sampling.params import GREEDY_EPS, SamplingParams

_MASK64 = (1 << 64) - 1


def seed_for(seed: int, output_index: int) -> int:
    """A 32-bit generator seed that depends only on the request seed and the output index.

    32 bits because CPU generators (mt19937) ignore higher seed bits.
    """
    x = (seed * 0x9E3779B97F4A7C15 + output_index * 0xBF58476D1CE4E5B9 + 1) & _MASK64
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & _MASK64
    return (x ^ (x >> 32)) & 0xFFFFFFFF


class Sampler:
    def __init__(
        self, device: torch.device | str = "cpu", seed: int = 0, vocab_limit: int | None = None
    ) -> None:
        if vocab_limit is not None and vocab_limit < 1:
            raise ValueError(f"vocab_limit must be >= 1, got {vocab_limit}")
        self.device = torch.device(device)
        self.vocab_limit = vocab_limit
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)

    def sample(
        self,
        logits: torch.Tensor,
        params: Sequence[SamplingParams],
        output_index: Sequence[int],
    ) -> list[int]:
        """One token per row of ``logits`` ``[N, vocab]`` (float32), below ``vocab_limit``."""
        n = logits.shape[0]
        if len(params) != n or len(output_index) != n:
            raise ValueError(
                f"{n} rows to sample but {len(params)} sampling params and "
                f"{len(output_index)} output indices"
            )
        if n == 0:
            return []
        logits = logits[:, : self.vocab_limit]
        tokens = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if rows:
            index = torch.tensor(rows, device=logits.device)
            probs = self._filtered_probs(logits[index], [params[i] for i in rows])
            noise = torch.empty_like(probs)
            for j, i in enumerate(rows):
                seed = params[i].seed
                if seed is None:
                    noise[j].exponential_(generator=self.generator)
                else:
                    gen = torch.Generator(device=logits.device)
                    gen.manual_seed(seed_for(seed, output_index[i]))
                    noise[j].exponential_(generator=gen)
            tokens[index] = (probs / noise).argmax(dim=-1)
        return [int(t) for t in tokens.tolist()]

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: Sequence[SamplingParams]) -> torch.Tensor:
        device = logits.device
        temps = torch.tensor([max(p.temperature, GREEDY_EPS) for p in params], device=device)
        logits = logits / temps[:, None]
        vocab = logits.shape[-1]
        top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
        top_p = torch.tensor([p.top_p for p in params], device=device, dtype=logits.dtype)
        need_k = bool((top_k < vocab).any())
        need_p = bool((top_p < 1.0).any())
        if need_k or need_p:
            sorted_logits, order = logits.sort(dim=-1, descending=True)
            ranks = torch.arange(vocab, device=device)[None, :]
            drop = ranks >= top_k.clamp(max=vocab)[:, None]
            sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
            before = sorted_probs.cumsum(dim=-1) - sorted_probs
            drop |= before > top_p[:, None]
            drop[:, 0] = False
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
        return logits.softmax(dim=-1)
