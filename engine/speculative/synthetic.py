"""``--speculative synthetic``: drafts accepted at set rates, whatever the model says.

On a GPU with dummy weights a real drafter's acceptance means nothing, yet
the verify step's cost and the batch size where speculation stops paying are
what one wants to measure (vLLM's synthetic rejection sampler and SGLang's
simulated acceptance length serve the same end). So the drafter proposes
``K`` real token ids every time (``core.scheduler.drafter.RepeatDrafter``: the
last token, repeated), the verify step computes all ``K + 1`` positions of a
slot as it would for any draft, and this rule, not the model, decides how many
are accepted. With per-position conditional rates ``a_0 .. a_{K-1}``::

    draft token i (at output index n + i) is accepted  iff  u(rid, n + i) < a_i
    j = the first i that is not (len(draft) if none)
    verified = draft[:j] + [t_j]          (t_j: the model's token sampled at position j)

so a slot delivers ``j + 1`` tokens, as a real verification would, and
``P(j >= i) = a_0 * .. * a_{i-1}``. One rate stands for every position. ``u`` is
a uniform in [0, 1), a hash of the request id and the output index: no state,
the same in every process and every run that sees the same request ids (the
server's are fresh, so its draws differ from run to run, with the same
statistics). Log-probs, when asked for, are the model's of the token it sampled
at each position, not of the draft token delivered there.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Sequence

from engine.sampling.verify import SlotVerifier


def parse_rates(text: str) -> tuple[float, ...]:
    """``--acceptance-rate``: one rate, or comma-separated rates, each in [0, 1]."""
    try:
        rates = tuple(float(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected rates in [0, 1], comma-separated, got {text!r}"
        ) from None
    check_rates(rates, None, argparse.ArgumentTypeError)
    return rates


def check_rates(rates: Sequence[float], k: int | None, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` unless ``rates`` are one rate, or ``k`` of them (any number when ``k`` is
    None), each in [0, 1]."""
    if not rates:
        raise error("--acceptance-rate needs at least one rate")
    for rate in rates:
        if not 0.0 <= rate <= 1.0:
            raise error(f"--acceptance-rate: every rate must be in [0, 1], got {rate}")
    if k is not None and len(rates) > 1 and len(rates) != k:
        raise error(
            f"--acceptance-rate gives {len(rates)} per-position rates for --num-draft-tokens {k}: "
            "give one rate, or exactly one per draft position"
        )


def uniform(rid: str, output_index: int) -> float:
    """A uniform in [0, 1) that only ``rid`` and ``output_index`` decide."""
    digest = hashlib.blake2b(f"{rid}/{output_index}".encode(), digest_size=8).digest()
    return (int.from_bytes(digest, "little") >> 11) * 2.0**-53


class SyntheticAcceptance:
    """Accepts draft tokens at per-position conditional ``rates`` (one: for every position)."""

    def __init__(self, rates: Sequence[float]) -> None:
        check_rates(rates, None)
        self.rates = tuple(rates)

    def rate(self, i: int) -> float:
        """``a_i``, the rate of draft position ``i`` (from 0)."""
        return self.rates[0] if len(self.rates) == 1 else self.rates[i]

    def accepted(self, rid: str, output_index: int, k: int) -> int:
        """Draft tokens accepted of a slot of ``k`` whose first sampled token is output
        ``output_index`` of ``rid``."""
        for i in range(k):
            if uniform(rid, output_index + i) >= self.rate(i):
                return i
        return k

    def verifier(self, rids: Sequence[str], output_index: Sequence[int]) -> SlotVerifier:
        """The rule for one step: ``rids`` and ``output_index`` per request of
        ``plan.sampling_rids()`` (``StepInputs.output_index``)."""

        def verify(i: int, sampled: Sequence[int], draft: Sequence[int]) -> list[int]:
            j = self.accepted(rids[i], output_index[i], len(draft))
            return [*draft[:j], int(sampled[j])]

        return verify
