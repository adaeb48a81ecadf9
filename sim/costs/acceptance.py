"""The acceptance model of speculative decoding: how many draft tokens a verify step keeps.

The simulator's drafter proposes placeholders (``core.scheduler.PlaceholderDrafter``);
how many of a slot's ``k`` draft tokens the target model accepts is drawn here,
and ``Scheduler.complete(plan, None, accepted=...)`` delivers that many plus one.
The model is per-position conditional rates::

    a_i = P(draft token i accepted | tokens 1 .. i-1 were)       i = 1 .. K

and a slot with ``k <= K`` drafts accepts ``n`` tokens where ``n`` is the
first ``i`` whose draw fails (``k`` if none does). ``empirical`` models draw
``n`` from a measured histogram of accepted lengths instead (``P(n)`` for
``n < k``, the rest of the mass at ``k``).

Not every decode slot carries a draft: the engine's n-gram drafter proposes
one only where it finds a match (a quarter of the slots of chat, most of those
of a copying prompt). ``draft_share`` is the share of decode slots that carry
one; the others decode plainly (``sim.model.drafter``). The histogram counts
verify slots only, so the rates are of drafted slots.

What informs it (``load_acceptance``), never assumed: rates given by hand
(``"0.8,0.6,0.5,0.4"``; one rate repeats: geometric), or a measurement of the
engine (``engine serve --speculative ngram``):

- ``/metrics`` saved to a file: the histogram ``engine_spec_decode_accepted_length``
  counts the verify slots by accepted draft tokens (0 .. ``--num-draft-tokens``),
  summed over replicas. It is the engine's only per-slot measurement; the rates
  are ``a_i = P(n >= i) / P(n >= i - 1)``. It does not say how many drafts each
  slot carried: a slot that the drafter gave fewer than ``K`` tokens (no long
  enough match, the output limit) can accept no more, which biases the later
  rates low (rather a lower bound on them). The counters
  ``engine_spec_decode_num_drafts_total`` and ``..._num_undrafted_slots_total``
  give ``draft_share`` = drafts / (drafts + undrafted) (1 when the page has no
  undrafted counter);
- a JSON file: ``{"rates": [...]}``, or ``{"accepted_lengths": [c_0, c_1, ...]}``
  (the engine's ``SpeculativeStats``; an optional ``"num_draft_tokens"`` says
  the ``K`` it ran with, else ``len - 1``); ``"draft_share"``, or the stats'
  ``"undrafted_slots"``, gives the share of slots drafted;
- a step record (``engine_steps.csv`` of ``--record-steps``): only per-step sums
  of draft and accepted tokens, so one geometric rate whose mean acceptance
  per draft token equals the record's, assuming every slot carried ``K``.

Draws are deterministic: each is a hash of the run's seed, the request and the
draft token's position (``uniforms``), so they do not depend on batch order,
replica placement or the loop: two configurations that place the same draft
draw the same acceptance (common random numbers for sweeps).
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.scheduler.plan import Plan

DRAWS = ("rates", "empirical")
"""How a slot's accepted count is drawn: a chain of per-position rates, or the histogram."""
METRIC = "engine_spec_decode_accepted_length"
"""The engine's ``/metrics`` histogram of accepted draft tokens per verify slot."""
DRAFTED = "engine_spec_decode_num_drafts_total"
UNDRAFTED = "engine_spec_decode_num_undrafted_slots_total"
"""The engine's ``/metrics`` counters of decode slots with and without a draft."""


@dataclass(frozen=True, slots=True)
class AcceptanceModel:
    """Per-position acceptance rates ``a_1 .. a_K`` (``rates``), and the histogram of
    accepted lengths they came from when measured (``histogram[n]``: slots that accepted
    ``n``; ``empirical`` draws from it). ``geometric``: one rate for every position.
    ``draft_share``: the share of decode slots that carry a draft at all."""

    rates: tuple[float, ...]
    source: str
    histogram: tuple[int, ...] = ()
    empirical: bool = False
    geometric: bool = False
    draft_share: float = 1.0

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("an acceptance model needs at least one rate")
        for i, a in enumerate(self.rates, 1):
            if not (isinstance(a, int | float) and 0.0 <= a <= 1.0):
                raise ValueError(f"acceptance rate a_{i} must be in [0, 1], got {a!r}")
        share = self.draft_share
        if not (isinstance(share, int | float) and 0.0 <= share <= 1.0):
            raise ValueError(f"draft share must be in [0, 1], got {share!r}")
        if self.empirical and not self.histogram:
            raise ValueError("empirical draws need a histogram of accepted lengths")

    @staticmethod
    def of_rates(rates: Sequence[float], source: str = "given rates") -> AcceptanceModel:
        """The model of per-position rates ``a_1 .. a_K``."""
        return AcceptanceModel(tuple(float(a) for a in rates), source)

    @staticmethod
    def of_rate(rate: float, source: str = "given rate") -> AcceptanceModel:
        """One rate for every position (the accepted count is a truncated geometric)."""
        return AcceptanceModel((float(rate),), source, geometric=True)

    @staticmethod
    def of_histogram(
        counts: Sequence[int], source: str = "histogram", empirical: bool = False
    ) -> AcceptanceModel:
        """Rates estimated from ``counts[n]``, the verify slots that accepted ``n`` draft tokens
        (``n`` = 0 .. K): ``a_i = P(n >= i) / P(n >= i - 1)`` (0 where no slot got that far)."""
        hist = tuple(counts)
        if len(hist) < 2:
            raise ValueError(
                f"{source}: a histogram of accepted lengths needs counts for 0 .. K >= 1"
            )
        for n, c in enumerate(hist):
            if isinstance(c, bool) or not isinstance(c, int) or c < 0:
                raise ValueError(f"{source}: count of accepted length {n} must be an integer >= 0")
        if sum(hist) == 0:
            raise ValueError(f"{source}: the histogram counts no verify slot")
        at_least = np.cumsum(hist[::-1])[::-1]  # at_least[i] = slots with n >= i
        rates = tuple(
            float(at_least[i] / at_least[i - 1]) if at_least[i - 1] else 0.0
            for i in range(1, len(hist))
        )
        return AcceptanceModel(rates, source, hist, empirical)

    @property
    def max_drafts(self) -> int | None:
        """The most draft tokens per slot the model covers (None: any, geometric)."""
        return None if self.geometric else len(self.rates)

    def check_covers(self, num_draft_tokens: int) -> None:
        """``ValueError`` unless slots of ``num_draft_tokens`` drafts can be drawn."""
        most = self.max_drafts
        if most is not None and num_draft_tokens > most:
            raise ValueError(
                f"the acceptance model ({self.source}) covers {most} draft positions, "
                f"--num-draft-tokens {num_draft_tokens} needs as many (one rate repeats for any)"
            )

    def rate(self, i: int) -> float:
        """``a_i``, for draft position ``i`` >= 1."""
        return self.rates[0] if self.geometric else self.rates[i - 1]

    def pmf(self, k: int) -> np.ndarray:
        """The histogram's distribution of the accepted count of a slot with ``k`` drafts."""
        hist = np.asarray(self.histogram[: k + 1], dtype=np.float64)
        hist[-1] += sum(self.histogram[k + 1 :])
        pmf: np.ndarray = hist / hist.sum()
        return pmf

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "draw": "empirical" if self.empirical else "rates",
            "rates": list(self.rates),
            "geometric": self.geometric,
            "draft_share": self.draft_share,
            "source": self.source,
        }
        if self.histogram:
            out["histogram"] = list(self.histogram)
        return out


@dataclass(slots=True)
class AcceptanceDraws:
    """Draws accepted counts for the draft slots of plans, and tallies them as the engine's
    ``/metrics`` does (``accepted_lengths[n]``: slots that accepted ``n``)."""

    model: AcceptanceModel
    seed: int = 0
    verify_slots: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_lengths: list[int] = field(default_factory=list)
    _cdfs: dict[int, np.ndarray] = field(default_factory=dict, repr=False)

    def draw(self, plan: Plan) -> dict[str, int] | None:
        """The accepted draft tokens of each of ``plan``'s slots with a draft (None: none)."""
        slots = [d for d in plan.decode if d.draft]
        if not slots:
            return None
        ks = np.fromiter((len(d.draft) for d in slots), np.int64, len(slots))
        keys = np.fromiter((zlib.crc32(d.rid.encode()) for d in slots), np.uint64, len(slots))
        positions = np.fromiter((d.position for d in slots), np.uint64, len(slots))
        if self.model.empirical:
            u = uniforms(self.seed, keys, positions)
            counts = [
                int(np.searchsorted(self._cdf(int(k)), x, side="right"))
                for k, x in zip(ks, u, strict=True)
            ]
        else:
            counts = self._chain(ks, keys, positions)
        for n in counts:
            while n >= len(self.accepted_lengths):
                self.accepted_lengths.append(0)
            self.accepted_lengths[n] += 1
        self.verify_slots += len(slots)
        self.draft_tokens += int(ks.sum())
        self.accepted_tokens += sum(counts)
        return {d.rid: n for d, n in zip(slots, counts, strict=True)}

    def _chain(self, ks: np.ndarray, keys: np.ndarray, positions: np.ndarray) -> list[int]:
        """Per slot, the draft positions accepted before the first rejection: position ``i``
        of a slot at ``p`` is accepted when its uniform (at ``p + i``) is below ``a_i``."""
        most = int(ks.max())
        offsets = np.arange(1, most + 1, dtype=np.uint64)
        u = uniforms(self.seed, keys[:, None], positions[:, None] + offsets[None, :])
        rates = np.array([self.model.rate(i) for i in range(1, most + 1)])
        ok = (u < rates[None, :]) & (np.arange(most)[None, :] < ks[:, None])
        accepted: np.ndarray = np.cumprod(ok, axis=1).sum(axis=1)
        return [int(n) for n in accepted]

    def _cdf(self, k: int) -> np.ndarray:
        cdf = self._cdfs.get(k)
        if cdf is None:
            cdf = self._cdfs[k] = np.cumsum(self.model.pmf(k))[:-1]
        return cdf

    def describe(self) -> dict[str, Any]:
        """The model and what the run drew (the counters of the engine's ``/metrics``)."""
        rate = self.accepted_tokens / self.draft_tokens if self.draft_tokens else math.nan
        return {
            "acceptance": self.model.describe(),
            "seed": self.seed,
            "verify_slots": self.verify_slots,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "acceptance_rate": rate,
            "accepted_lengths": list(self.accepted_lengths),
        }


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on ``uint64`` (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out: np.ndarray = x ^ (x >> np.uint64(31))
        return out


def uniforms(seed: int, keys: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Uniforms in [0, 1), one per (request key, position), a hash of them and ``seed``."""
    salt = _mix(np.array([seed & 0xFFFF_FFFF_FFFF_FFFF], dtype=np.uint64))
    base = _mix(np.asarray(keys, dtype=np.uint64) ^ salt)
    bits = _mix(base + np.asarray(positions, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03))
    out: np.ndarray = (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return out


# ---------------------------------------------------------------- what informs the model
def load_acceptance(
    spec: str, num_draft_tokens: int, empirical: bool = False, draft_share: float | None = None
) -> AcceptanceModel:
    """The model ``spec`` names: comma-separated rates (one: geometric), or a file of the
    engine's measurement (module doc); ``empirical`` draws from a measured histogram.
    ``num_draft_tokens`` (``K``) is what the model must cover (and a step record's ``K``);
    ``draft_share``, when given, overrides the measured share of slots drafted."""
    text = spec.strip()
    path = Path(text)
    if path.is_file():
        model = _of_file(path, num_draft_tokens, empirical)
    else:
        if empirical:
            raise ValueError(f"acceptance {spec!r}: empirical draws need a measured histogram")
        values = _rates(text)
        single = len(values) == 1
        model = AcceptanceModel.of_rate(values[0]) if single else AcceptanceModel.of_rates(values)
    model.check_covers(num_draft_tokens)
    return model if draft_share is None else replace(model, draft_share=float(draft_share))


def _of_file(path: Path, num_draft_tokens: int, empirical: bool) -> AcceptanceModel:
    name = path.name.lower()
    if name.endswith((".csv", ".csv.gz")):
        if empirical:
            raise ValueError(f"{path}: a step record holds sums, not a histogram to draw from")
        return rate_of_step_record(path, num_draft_tokens)
    if name.endswith(".json"):
        return _of_json(path, empirical)
    model = AcceptanceModel.of_histogram(metrics_histogram(path), f"/metrics of {path}", empirical)
    return replace(model, draft_share=metrics_draft_share(path))


def _rates(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(
            f"acceptance {text!r}: neither comma-separated rates in [0, 1] nor a file"
        ) from None
    if not values:
        raise ValueError(f"acceptance {text!r}: no rate given")
    return values


def _of_json(path: Path, empirical: bool) -> AcceptanceModel:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: cannot parse JSON ({exc})") from None
    if isinstance(data, dict) and "rates" in data:
        if empirical:
            raise ValueError(f"{path}: empirical draws need accepted_lengths, not rates")
        model = AcceptanceModel.of_rates(_numbers(data["rates"], path), f"rates of {path}")
        return replace(model, draft_share=data.get("draft_share", 1.0))
    if isinstance(data, dict) and "accepted_lengths" in data:
        counts = list(data["accepted_lengths"])
        share = data.get("draft_share")
        undrafted = data.get("undrafted_slots")
        if share is None and isinstance(undrafted, int) and sum(counts) + undrafted > 0:
            share = sum(counts) / (sum(counts) + undrafted)
        k = data.get("num_draft_tokens")
        if k is not None:
            if not isinstance(k, int) or len(counts) > k + 1:
                raise ValueError(f"{path}: accepted lengths past num_draft_tokens {k!r}")
            counts += [0] * (k + 1 - len(counts))
        model = AcceptanceModel.of_histogram(counts, f"accepted lengths of {path}", empirical)
        return replace(model, draft_share=1.0 if share is None else share)
    raise ValueError(f"{path}: expected a JSON object with 'rates' or 'accepted_lengths'")


def _numbers(value: object, path: Path) -> list[float]:
    if not isinstance(value, list) or not all(isinstance(v, int | float) for v in value):
        raise ValueError(f"{path}: 'rates' must be a list of numbers")
    return [float(v) for v in value]


_BUCKET = re.compile(METRIC + r"_bucket\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)")
_LE = re.compile(r'le="(?P<le>[^"]+)"')


def metrics_histogram(path: Path) -> list[int]:
    """Verify slots by accepted draft tokens (0 .. K) from a saved ``/metrics`` page: the
    cumulative buckets of ``engine_spec_decode_accepted_length``, summed over replicas."""
    cumulative: dict[int, float] = {}
    for match in _BUCKET.finditer(path.read_text(encoding="utf-8")):
        le = _LE.search(match["labels"])
        if le is None or le["le"] == "+Inf":
            continue
        n = int(float(le["le"]))
        cumulative[n] = cumulative.get(n, 0.0) + float(match["value"])
    if not cumulative:
        raise ValueError(f"{path}: no {METRIC} histogram (saved from a speculating engine)")
    cum = [cumulative.get(n, 0.0) for n in range(max(cumulative) + 1)]
    counts = [round(c - (cum[n - 1] if n else 0.0)) for n, c in enumerate(cum)]
    if any(c < 0 for c in counts):
        raise ValueError(f"{path}: the {METRIC} buckets are not cumulative")
    return counts


def metrics_draft_share(path: Path) -> float:
    """The share of decode slots that carried a draft, from a saved ``/metrics`` page's
    counters summed over replicas (1 without the undrafted counter, or without slots)."""
    text = path.read_text(encoding="utf-8")
    drafted, undrafted = (
        sum(float(m[1]) for m in re.finditer(f"^{name}" + r"(?:\{[^}]*\})?\s+(\S+)", text, re.M))
        for name in (DRAFTED, UNDRAFTED)
    )
    if UNDRAFTED not in text or drafted + undrafted <= 0:
        return 1.0
    return drafted / (drafted + undrafted)


def rate_of_step_record(path: Path, num_draft_tokens: int) -> AcceptanceModel:
    """One geometric rate from a step record's sums: the rate ``a`` whose mean acceptance per
    draft token, ``(a + a^2 + .. + a^K) / K``, equals the record's accepted over drafted
    tokens, ``K`` = ``num_draft_tokens`` (every slot taken to carry ``K``; module doc)."""
    from schema.steprecord import SPECULATIVE_COLUMNS, read_step_record

    frame = read_step_record(path)
    if not set(SPECULATIVE_COLUMNS) <= set(frame.columns):
        raise ValueError(f"{path}: no draft_tokens/accepted_tokens (not a speculating engine's)")
    drafts = int(frame["draft_tokens"].sum())
    if drafts == 0:
        raise ValueError(f"{path}: no step verified a draft")
    if num_draft_tokens < 1:
        raise ValueError("a step record's rate needs --num-draft-tokens >= 1")
    per_token = int(frame["accepted_tokens"].sum()) / drafts
    k = num_draft_tokens
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the mean per token rises with a, from 0 to 1
        a = (lo + hi) / 2
        lo, hi = (a, hi) if sum(a**i for i in range(1, k + 1)) / k < per_token else (lo, a)
    source = f"step record {path}: {per_token:.4f} accepted a draft token, K={k}"
    return AcceptanceModel.of_rate(min(max((lo + hi) / 2, 0.0), 1.0), source)
