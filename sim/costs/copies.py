"""Time of the host KV tier's copies: a plan's writes (device -> host) and loads (host -> device).

A plan's copies of one direction run as one batched copy (the engine gathers
and scatters pages by index), so each direction costs a fixed time plus a time
per KV token::

    load_time(tokens)  = load_fixed  + load_per_token  * tokens   (0 without loads)
    write_time(tokens) = write_fixed + write_per_token * tokens   (0 without writes)

From a profile's rows (``engine profile`` measures them) when it has all four
kinds, else from the hardware's host link (``sim.costs.presets``) and the KV
bytes of a token.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.costs.presets import Hardware
from sim.costs.profile import COPY_KINDS, Profile


@dataclass(frozen=True, slots=True)
class CopyCosts:
    load_fixed: float
    load_per_token: float
    write_fixed: float
    write_per_token: float
    source: str

    def load_time(self, tokens: int) -> float:
        return self.load_fixed + self.load_per_token * tokens if tokens else 0.0

    def write_time(self, tokens: int) -> float:
        return self.write_fixed + self.write_per_token * tokens if tokens else 0.0

    def describe(self) -> dict[str, object]:
        return {
            "load_fixed_s": self.load_fixed,
            "load_per_token_s": self.load_per_token,
            "write_fixed_s": self.write_fixed,
            "write_per_token_s": self.write_per_token,
            "source": self.source,
        }


def copy_costs(profile: Profile | None, hw: Hardware, kv_bytes_per_token: float) -> CopyCosts:
    """The profile's copy rows when it has them all, else the hardware's host link."""
    if profile is not None and set(COPY_KINDS) <= profile.cpu.keys():
        h2d, h2d_token, d2h, d2h_token = (profile.cpu[k] for k in COPY_KINDS)
        return CopyCosts(h2d, h2d_token, d2h, d2h_token, source=profile.path)
    per_token = kv_bytes_per_token / hw.host_bandwidth
    fixed = hw.host_copy_latency_s
    source = f"hardware {hw.name}: host link {hw.host_bandwidth / 1e9:g} GB/s, {fixed * 1e6:g} us"
    return CopyCosts(fixed, per_token, fixed, per_token, source=source)
