"""How far the steps of a replay reach, against the steps a profile measured.

A table cost model prices a step from fits to a profile's grid; a step beyond
the grid (a decode batch holding a longer request than any measured, a prefill
reading more query-key pairs) is priced by extrapolation, and a measured fact
then says nothing about it (a decode of 120k tokens beside a prefill chunk costs
a step several times what a fit over 4k decodes gives it, on the H200). The
replay keeps the largest value of each feature below; its summary sets them
beside the profile's (``cost_model.reach``) and names the features it exceeded.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from core.scheduler.shape import StepShape


@dataclass(slots=True)
class Reach:
    """The largest value of each feature over a set of steps."""

    decode_batch: int = 0  # decode requests in a step
    decode_longest: int = 0  # KV positions the longest decode request of a step reads
    prefill_tokens: int = 0  # prefill tokens in a step
    prefill_attention: int = 0  # query-key pairs of a step's prefill chunks

    def widen(self, shape: StepShape) -> None:
        """Take in one step."""
        n = shape.decode_requests
        if n:
            if n > self.decode_batch:
                self.decode_batch = n
            longest = shape.decode_padded // n
            if longest > self.decode_longest:
                self.decode_longest = longest
        if shape.prefill_tokens > self.prefill_tokens:
            self.prefill_tokens = shape.prefill_tokens
        if shape.prefill_attention > self.prefill_attention:
            self.prefill_attention = shape.prefill_attention

    def widen_run(self, batch: int, longest: int) -> None:
        """Take in a decode run of ``batch`` requests whose last step reads ``longest``."""
        self.decode_batch = max(self.decode_batch, batch)
        self.decode_longest = max(self.decode_longest, longest)

    def merge(self, other: Reach) -> None:
        for f in fields(self):
            setattr(self, f.name, max(getattr(self, f.name), getattr(other, f.name)))

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def beyond(self, measured: Reach) -> dict[str, int]:
        """The features where these steps went past ``measured``, with their largest value."""
        return {k: v for k, v in self.as_dict().items() if v > getattr(measured, k)}


def measured_reach(shapes: list[StepShape]) -> Reach:
    reach = Reach()
    for shape in shapes:
        reach.widen(shape)
    return reach


def reach_summary(measured: Reach | None, replayed: Reach) -> dict[str, object] | None:
    """``cost_model.reach`` of a summary: None for a cost model without a measured grid."""
    if measured is None:
        return None
    return {
        "measured": measured.as_dict(),
        "replayed": replayed.as_dict(),
        "beyond": replayed.beyond(measured),
    }


def reach_warning(reach: dict[str, object] | None) -> str | None:
    """The line ``sim replay`` prints when the replay priced steps beyond the profile."""
    if not reach or not reach["beyond"]:
        return None
    measured = reach["measured"]
    assert isinstance(measured, dict) and isinstance(reach["beyond"], dict)
    parts = [
        f"{k} {v:,} ({v / measured[k]:.2f}x the measured {measured[k]:,})"
        if measured[k]
        else f"{k} {v:,} (none measured)"
        for k, v in reach["beyond"].items()
    ]
    return "beyond the profile: " + ", ".join(parts) + " (priced by extrapolation)"
