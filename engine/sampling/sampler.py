"""Batched next-token sampling on the device: greedy, temperature, top-k, top-p, seeds.

The whole batch is sampled with a fixed number of tensor operations, whatever
its mix of parameters: no per-request kernels, no per-request Python work past
building the parameter arrays (``SamplingArrays``).

Only the first ``vocab_limit`` ids are ever drawn (the other logits are cut off
first), so a model whose vocabulary outgrows its tokenizer yields only ids the
tokenizer can decode. Greedy rows take the argmax. The others are scaled by
their temperature, filtered by top-k then top-p, and drawn by the
exponential-race trick (``argmax(p / E)`` with ``E ~ Exp(1)``, equivalent to
drawing from ``p``). A row with a seed takes its noise from a counter-based hash
of (seed, output index, token id), so its token depends on nothing else in the
batch and repeats run to run; rows without a seed share the sampler's
generator, so tensor-parallel ranks that sample the same logits in the same
order draw the same tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from engine.sampling.params import GREEDY_EPS, SamplingParams

_M32 = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class SamplingArrays:
    """The sampling parameters of a step's sampled rows, as arrays (host or device).

    ``top_k`` holds the vocabulary size where top-k is off; ``seed`` is -1 for
    rows without a seed. The flags say which stages any row needs.
    """

    temperature: np.ndarray | torch.Tensor  # float32 [N], 0 for greedy rows
    top_p: np.ndarray | torch.Tensor  # float32 [N]
    top_k: np.ndarray | torch.Tensor  # int64 [N]
    seed: np.ndarray | torch.Tensor  # int64 [N]
    counter: np.ndarray | torch.Tensor  # int64 [N]: the output index of the drawn token
    any_random: bool
    any_top_k: bool
    any_top_p: bool
    any_seeded: bool
    any_unseeded: bool

    @staticmethod
    def build(
        params: Sequence[SamplingParams], output_index: Sequence[int], vocab: int
    ) -> SamplingArrays:
        greedy = [p.is_greedy for p in params]
        temperature = np.array(
            [0.0 if g else p.temperature for p, g in zip(params, greedy, strict=True)],
            dtype=np.float32,
        )
        top_k = np.array([p.top_k if 0 < p.top_k < vocab else vocab for p in params], np.int64)
        top_p = np.array([p.top_p for p in params], dtype=np.float32)
        seed = np.array([-1 if p.seed is None else p.seed for p in params], dtype=np.int64)
        random = ~np.asarray(greedy, dtype=bool)
        return SamplingArrays(
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            counter=np.asarray(output_index, dtype=np.int64),
            any_random=bool(random.any()),
            any_top_k=bool((random & (top_k < vocab)).any()),
            any_top_p=bool((random & (top_p < 1.0)).any()),
            any_seeded=bool((random & (seed >= 0)).any()),
            any_unseeded=bool((random & (seed < 0)).any()),
        )

    def host_arrays(self) -> list[np.ndarray]:
        return [self.temperature, self.top_p, self.top_k, self.seed, self.counter]  # type: ignore[list-item]

    def with_arrays(self, arrays: Sequence[torch.Tensor]) -> SamplingArrays:
        """The same flags over ``arrays`` (the order of ``host_arrays``), e.g. on the device."""
        t, p, k, s, c = arrays
        return SamplingArrays(
            t,
            p,
            k,
            s,
            c,
            self.any_random,
            self.any_top_k,
            self.any_top_p,
            self.any_seeded,
            self.any_unseeded,
        )


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
        arrays = SamplingArrays.build(params, output_index, self._vocab(logits))
        device = [torch.from_numpy(a).to(logits.device) for a in arrays.host_arrays()]
        return [int(t) for t in self.sample_tensor(logits, arrays.with_arrays(device)).tolist()]

    def _vocab(self, logits: torch.Tensor) -> int:
        vocab = int(logits.shape[-1])
        return vocab if self.vocab_limit is None else min(vocab, self.vocab_limit)

    def sample_tensor(self, logits: torch.Tensor, arrays: SamplingArrays) -> torch.Tensor:
        """Tokens ``[N]`` (int64, on the device) for ``arrays`` already on the device."""
        logits = logits[:, : self._vocab(logits)]
        tokens = logits.argmax(dim=-1)
        if not arrays.any_random or logits.shape[0] == 0:
            return tokens
        temperature = torch.as_tensor(arrays.temperature)
        random = temperature > 0
        scaled = logits / temperature.clamp(min=GREEDY_EPS)[:, None]
        if arrays.any_top_k or arrays.any_top_p:
            scaled = _top_k_top_p(
                scaled, torch.as_tensor(arrays.top_k), torch.as_tensor(arrays.top_p)
            )
        probs = scaled.softmax(dim=-1)
        noise = self._exponential_noise(probs, arrays)
        drawn = (probs / noise).argmax(dim=-1)
        return torch.where(random, drawn, tokens)

    def _exponential_noise(self, probs: torch.Tensor, arrays: SamplingArrays) -> torch.Tensor:
        seed = torch.as_tensor(arrays.seed)
        noise = torch.empty_like(probs)
        if arrays.any_unseeded:
            noise.exponential_(generator=self.generator)
        if arrays.any_seeded:
            hashed = exponential_from_hash(seed, torch.as_tensor(arrays.counter), probs.shape[1])
            noise = torch.where((seed >= 0)[:, None], hashed, noise)
        return noise


def _top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    vocab = logits.shape[-1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)[None, :]
    drop = ranks >= top_k.clamp(max=vocab)[:, None]
    sorted_probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    drop |= before > top_p[:, None]
    drop[:, 0] = False
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, sorted_logits)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer hash on int64 tensors holding values in ``[0, 2**32)``.

    The multipliers stay below 2**31, so no product leaves the int64 range.
    """
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x5BD1E995) & _M32
    return x ^ (x >> 16)


def exponential_from_hash(seed: torch.Tensor, counter: torch.Tensor, vocab: int) -> torch.Tensor:
    """``Exp(1)`` noise ``[N, vocab]`` (float32) that depends only on (seed, counter, token id)."""
    seed = seed.clamp(min=0)
    key = _mix32(_mix32(seed & _M32) ^ ((seed >> 32) & _M32))
    key = _mix32(key ^ _mix32((counter & _M32) ^ 0x2545F491))
    ids = torch.arange(vocab, dtype=torch.int64, device=seed.device) * 0x9E3779B1 & _M32
    bits = _mix32(key[:, None] ^ ids[None, :])
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return -torch.log(uniform)
