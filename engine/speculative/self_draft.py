"""A model-based drafter: the target model's own first layers (a self-speculative early exit).

``SelfDrafter`` proposes draft tokens with the first ``num_layers`` decoder
layers of the served model, followed by its final norm and its LM head: no
second checkpoint, no training, and a draft that costs about
``num_layers / layers`` of a batch-1 decode step per token. Its acceptance is
what the early exit agrees with the full model (greedy), which depends on the
model and on ``num_layers``; the engine's counters measure it.

Each request drafted for keeps the draft layers' K/V of its sequence in dense
tensors of its own (``DenseAttention``; not the served KV pool, which holds
only the verified sequence), fed by the tokens it has not seen yet: after a
verification the cache is cut back to the longest prefix it shares with the
request's sequence (rejected draft tokens drop out), then the rest is fed as
one chunk and the draft tokens one at a time, greedily. The caches of the
``max_sequences`` requests drafted for most recently are kept; an older one is
rebuilt from its whole sequence when it drafts again. A draft runs on rank 0
alone, so only without tensor parallelism (its linear layers would wait for
the other ranks).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from core.scheduler.request import Request
from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.models.llama import LlamaForCausalLM


class DenseAttention(AttentionBackend):
    """One sequence's K/V for the draft layers, in dense tensors grown as tokens are fed.

    ``begin(n)`` opens room for the ``n`` tokens of the next forward pass; each layer's
    ``forward`` stores their K/V after the ones already held and attends causally over all of
    them; ``commit`` makes them part of the sequence once every layer ran.
    """

    name = "dense-draft"

    def __init__(
        self, layers: int, heads: tuple[int, int], head_dim: int, scale: float, like: torch.Tensor
    ) -> None:
        q_heads, kv_heads = heads
        self.num_q_heads = q_heads
        self.scale = scale
        self.length = 0
        self._feeding = 0
        self._k = [like.new_empty(0, kv_heads, head_dim) for _ in range(layers)]
        self._v = [like.new_empty(0, kv_heads, head_dim) for _ in range(layers)]

    def prepare(self, meta: AttentionMetadata) -> None:
        raise NotImplementedError("a draft's attention is dense: begin() and commit()")

    def begin(self, n: int) -> None:
        need = self.length + n
        if need > self._k[0].shape[0]:
            size = max(need, 2 * self._k[0].shape[0], 64)
            for layer in range(len(self._k)):
                self._k[layer] = _grown(self._k[layer], size, self.length)
                self._v[layer] = _grown(self._v[layer], size, self.length)
        self._feeding = n

    def commit(self) -> None:
        self.length += self._feeding
        self._feeding = 0

    def truncate(self, length: int) -> None:
        self.length = min(self.length, length)

    def forward(
        self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        start, n = self.length, q.shape[0]
        end = start + n
        self._k[layer][start:end] = k
        self._v[layer][start:end] = v
        keys, values = self._k[layer][:end], self._v[layer][:end]
        rows = torch.arange(start, end, device=q.device)[:, None]
        mask = torch.arange(end, device=q.device)[None, :] <= rows  # [n, end], causal
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1),
            keys.transpose(0, 1),
            values.transpose(0, 1),
            attn_mask=mask,
            scale=self.scale,
            enable_gqa=True,
        )
        return out.transpose(0, 1)


def _grown(t: torch.Tensor, size: int, keep: int) -> torch.Tensor:
    out = t.new_empty(size, *t.shape[1:])
    out[:keep] = t[:keep]
    return out


def check_self_draft(num_layers: int, total: int, tp_size: int) -> None:
    """Raise ``ValueError`` unless ``num_layers`` of a ``total``-layer model can draft at TP
    ``tp_size``."""
    if not 1 <= num_layers < total:
        raise ValueError(
            f"--draft-layers takes 1 to {total - 1} of the model's {total} layers, got {num_layers}"
        )
    if tp_size > 1:
        raise ValueError("--speculative self drafts on rank 0 alone: it needs --tp 1")


class SelfDrafter:
    """Drafts greedily with ``model``'s first ``num_layers`` layers (see the module)."""

    def __init__(self, model: LlamaForCausalLM, num_layers: int, max_sequences: int) -> None:
        check_self_draft(num_layers, len(model.model.layers), model.tp.size)
        self.model = model
        self.num_layers = num_layers
        self.max_sequences = max(1, max_sequences)
        self._caches: OrderedDict[str, tuple[list[int], DenseAttention]] = OrderedDict()

    def propose(self, req: Request, k: int) -> Sequence[int]:
        if k <= 0:
            return ()
        sequence = [*req.prompt, *req.output]
        fed, cache = self._cache(req.rid)
        common = _common_prefix(fed, sequence)
        if common == len(sequence):  # everything fed already: feed the last token again
            common -= 1
        del fed[common:]
        cache.truncate(common)
        draft: list[int] = []
        feed = sequence[common:]
        with torch.inference_mode():
            for _ in range(k):
                draft.append(self._next(feed, cache))
                fed += feed
                feed = draft[-1:]
        return draft

    def _cache(self, rid: str) -> tuple[list[int], DenseAttention]:
        entry = self._caches.get(rid)
        if entry is not None:
            self._caches.move_to_end(rid)
            return entry
        cfg, tp = self.model.config, self.model.tp.size
        like = self.model.model.embed_tokens.weight
        heads = (cfg.num_heads // tp, cfg.num_kv_heads // tp)
        dense = DenseAttention(self.num_layers, heads, cfg.head_dim, cfg.head_dim**-0.5, like)
        entry = self._caches[rid] = ([], dense)
        while len(self._caches) > self.max_sequences:
            self._caches.popitem(last=False)
        return entry

    def _next(self, tokens: list[int], cache: DenseAttention) -> int:
        """Feed ``tokens`` after the cached ones through the draft layers; the greedy next."""
        model, device = self.model, self.model.model.embed_tokens.weight.device
        ids = torch.tensor(tokens, dtype=torch.long, device=device)
        positions = torch.arange(cache.length, cache.length + len(tokens), device=device)
        cache.begin(len(tokens))
        x = model.model.embed_tokens(ids)
        residual: torch.Tensor | None = None
        for layer in model.model.layers[: self.num_layers]:
            x, residual = layer(x, residual, positions, model.cos_sin, cache)
        cache.commit()
        assert residual is not None
        hidden, _ = model.model.norm.add_forward(x[-1:], residual[-1:])
        return int(model.compute_logits(hidden).argmax(-1).item())


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
