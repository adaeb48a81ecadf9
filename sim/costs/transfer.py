"""Time of prefill/decode disaggregation's KV transfer: a prompt's pages from a prefill
replica's pool into a decode replica's.

One transfer moves a request's pages in one message (the engine gathers them, sends them
over ZeroMQ and scatters them into the reserved pages: ``engine.kvcache.transfer``), so it
costs a fixed time plus a time per KV token::

    transfer_time(tokens) = fixed + per_token * tokens      (0 without tokens to move)

From the config's ``transfer_latency_s`` and ``transfer_gbps`` where given (a link the
engine was not measured on), else from a profile's rows (``engine profile`` measures the
engine's own mechanism: ``kv_transfer``, ``kv_transfer_token``); without either there is
no price, and a disaggregated replay says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.costs.profile import TRANSFER_KINDS, Profile


@dataclass(frozen=True, slots=True)
class TransferCosts:
    """The price of one transfer of ``tokens`` KV tokens, each ``bytes_per_token`` bytes."""

    fixed: float
    per_token: float
    bytes_per_token: float
    source: str

    def transfer_time(self, tokens: int) -> float:
        return self.fixed + self.per_token * tokens if tokens > 0 else 0.0

    def nbytes(self, tokens: int) -> int:
        return round(self.bytes_per_token * tokens)

    def describe(self) -> dict[str, object]:
        return {"fixed_s": self.fixed, "per_token_s": self.per_token,
                "bytes_per_token": self.bytes_per_token, "source": self.source}  # fmt: skip


def transfer_costs(
    profile: Profile | None,
    kv_bytes_per_token: float,
    latency_s: float | None = None,
    gbps: float | None = None,
) -> TransferCosts:
    """The transfer's price: ``latency_s`` and ``gbps`` (GB/s of KV) where given, else the
    profile's rows; ``ValueError`` when neither says."""
    measured = profile is not None and set(TRANSFER_KINDS) <= profile.cpu.keys()
    if measured and (latency_s is None or gbps is None):
        assert profile is not None
        fixed, per_token = (profile.cpu[k] for k in TRANSFER_KINDS)
        source = profile.path
        if latency_s is not None or gbps is not None:
            source += " with " + ", ".join(
                f"{name} {value:g}"
                for name, value in (("transfer_latency_s", latency_s), ("transfer_gbps", gbps))
                if value is not None
            )
        if latency_s is not None:
            fixed = latency_s
        if gbps is not None:
            per_token = kv_bytes_per_token / (gbps * 1e9)
        return TransferCosts(fixed, per_token, kv_bytes_per_token, source)
    if latency_s is None or gbps is None:
        where = "no profile" if profile is None else f"{profile.path} has no {TRANSFER_KINDS} rows"
        raise ValueError(
            f"the KV transfer has no price: {where} (engine profile measures them); give "
            "transfer_latency_s and transfer_gbps"
        )
    per_token = kv_bytes_per_token / (gbps * 1e9)
    given = f"given: {latency_s:g} s + {gbps:g} GB/s"
    return TransferCosts(latency_s, per_token, kv_bytes_per_token, given)


def check_disaggregated(
    prefill: int,
    decode: int,
    replicas: int,
    shared_frontend: bool,
    speculating: bool,
    latency_s: float | None,
    gbps: float | None,
) -> None:
    """``ValueError`` unless ``prefill`` and ``decode`` replicas (both 0: colocated) and the
    transfer's ``latency_s`` and ``gbps`` make a cluster a replay can run: both roles or
    neither, in place of ``replicas`` and a shared frontend, without speculative decoding."""
    for name, value in (("prefill_replicas", prefill), ("decode_replicas", decode)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    if (latency_s is not None and latency_s < 0) or (gbps is not None and gbps <= 0):
        raise ValueError("transfer_latency_s must be >= 0 and transfer_gbps > 0")
    if not (prefill or decode):
        return
    if not (prefill and decode):
        raise ValueError("a disaggregated cluster needs prefill_replicas and decode_replicas")
    if replicas != 1 or shared_frontend:
        raise ValueError(
            "prefill_replicas and decode_replicas replace replicas: each its own server "
            "(no replicas, no shared_frontend)"
        )
    if speculating:
        raise ValueError("speculative decoding is not served disaggregated")
