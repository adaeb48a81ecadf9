"""What informs the acceptance model (``sim.costs.acceptance``), never assumed: rates
given by hand (``"0.8,0.6,0.5,0.4"``; one rate repeats: geometric), or a measurement of
the engine (``engine serve --speculative ngram``), read by ``load_acceptance``:

- ``/metrics`` saved to a file: the histogram ``engine_spec_decode_accepted_length``
  counts the verify slots by accepted draft tokens (0 .. ``--num-draft-tokens``),
  summed over replicas, and the counter ``engine_spec_decode_num_tested_tokens_per_pos``
  the slots whose draft token at each position was tested (the draft that long, every
  token before it accepted): ``a_i = P(n >= i) / tested[i - 1]``. A page without the
  counter (an older engine's) gives ``a_i = P(n >= i) / P(n >= i - 1)``, low where drafts
  fell short of ``K`` (no long enough match, the output limit). The counters
  ``engine_spec_decode_num_drafts_total`` and ``..._num_undrafted_slots_total``
  give ``draft_share`` = drafts / (drafts + undrafted) (1 when the page has no
  undrafted counter);
- a JSON file: ``{"rates": [...]}``, or ``{"accepted_lengths": [c_0, c_1, ...]}``
  (the engine's ``SpeculativeStats``; an optional ``"num_draft_tokens"`` says
  the ``K`` it ran with, else ``len - 1``; an optional ``"tested_per_position"``
  the per-position tests, as above); ``"draft_share"``, or the stats'
  ``"undrafted_slots"``, gives the share of slots drafted;
- a step record (``engine_steps.csv`` of ``--record-steps``): only per-step sums
  of draft and accepted tokens, so one geometric rate whose mean acceptance
  per draft token equals the record's, assuming every slot carried ``K``.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from sim.costs.acceptance import METRIC, AcceptanceModel

DRAFTED = "engine_spec_decode_num_drafts_total"
UNDRAFTED = "engine_spec_decode_num_undrafted_slots_total"
"""The engine's ``/metrics`` counters of decode slots with and without a draft."""
TESTED = "engine_spec_decode_num_tested_tokens_per_pos_total"
"""The engine's ``/metrics`` counter of verify slots by draft position tested."""


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
    source = f"/metrics of {path}"
    tested = metrics_tested(path)
    model = AcceptanceModel.of_histogram(metrics_histogram(path), source, empirical, tested)
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
        tested = data.get("tested_per_position", [])
        if not isinstance(tested, list):
            raise ValueError(f"{path}: 'tested_per_position' must be a list of counts")
        source = f"accepted lengths of {path}"
        model = AcceptanceModel.of_histogram(counts, source, empirical, tested)
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


_TESTED = re.compile("^" + TESTED + r"\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)", re.M)
_POSITION = re.compile(r'position="(?P<position>\d+)"')


def metrics_tested(path: Path) -> list[int]:
    """Verify slots by draft position tested (from 0), from a saved ``/metrics`` page's
    counter summed over replicas (empty: a page without it)."""
    counts: dict[int, float] = {}
    for match in _TESTED.finditer(path.read_text(encoding="utf-8")):
        position = _POSITION.search(match["labels"])
        if position is not None:
            i = int(position["position"])
            counts[i] = counts.get(i, 0.0) + float(match["value"])
    return [round(counts.get(i, 0.0)) for i in range(max(counts, default=-1) + 1)]


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
