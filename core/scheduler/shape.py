"""The shape of one model step: the numbers a step's time depends on, derived from its plan.

The engine records it for every step it runs; the simulator's cost models price it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.scheduler.plan import Plan


@dataclass(frozen=True, slots=True)
class StepShape:
    """The work of one model step, in the terms a step's time depends on.

    A decode slot with a draft (speculative decoding) counts as the engine lays it
    out: an extend of ``1 + len(draft)`` tokens at its ``position``, causal over its
    context like a prefill chunk, every row sampled; ``prefill_tokens``,
    ``prefill_attention`` and ``context_tokens`` count it, the ``decode_*`` fields
    only the slots without one.

    ``context_tokens``: KV positions the step's attention reads, summed over the
    batch (``start + length`` per prefill chunk or verify span, ``position + 1``
    per decode slot).
    ``decode_context``: the decode slots' share of it (one query-key pair each).
    ``decode_padded``: KV positions of the decode slots padded to the longest
    one (decode requests x longest context), what an attention kernel that pads
    its decode batch reads.
    ``prefill_attention``: query-key pairs of the prefill chunks and verify spans (causal).
    ``sampled``: rows that produce logits (last prefill chunks, decodes, every row of a
    verify span).
    """

    prefill_tokens: int
    decode_requests: int
    context_tokens: int
    decode_context: int
    decode_padded: int
    prefill_attention: int
    sampled: int

    @property
    def extend_sampled(self) -> int:
        """Sampled rows of the prefill chunks and verify spans (``sampled`` less the decodes):
        a chunk samples its last row at most, a verify span every row."""
        return self.sampled - self.decode_requests

    @staticmethod
    def of_plan(plan: Plan) -> StepShape:
        prefill_tokens = prefill_context = attention = sampled = 0
        for c in plan.prefill:
            prefill_tokens += c.length
            prefill_context += c.start + c.length
            attention += c.length * c.start + c.length * (c.length + 1) // 2
            sampled += c.samples
        n_decode = decode_context = longest = 0  # KV positions read: position + 1 per slot
        for d in plan.decode:
            if d.draft:  # a verify span: an extend of the slot's token and its draft
                n = 1 + len(d.draft)
                prefill_tokens += n
                prefill_context += d.position + n
                attention += n * d.position + n * (n + 1) // 2
                sampled += n
                continue
            n_decode += 1
            read = d.position + 1
            decode_context += read
            if read > longest:
                longest = read
        return StepShape(
            prefill_tokens=prefill_tokens,
            decode_requests=n_decode,
            context_tokens=prefill_context + decode_context,
            decode_context=decode_context,
            decode_padded=n_decode * longest,
            prefill_attention=attention,
            sampled=sampled + n_decode,
        )

    @staticmethod
    def decode(batch: int, context: int, longest: int) -> StepShape:
        """A pure-decode step of ``batch`` requests reading ``context`` KV positions in all,
        ``longest`` for the longest request."""
        return StepShape(0, batch, context, context, batch * longest, 0, batch)
