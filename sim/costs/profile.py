"""Profile files: measured step times and CPU stage costs, with their provenance.

``engine profile`` writes them; the ``table`` cost model and ``CpuCosts`` read
them. CSV columns (``COLUMNS``)::

    kind,prefill_tokens,decode_requests,context_tokens,decode_context,decode_padded,
    prefill_attention,sampled,tp,duration_s,min_s,max_s,repeats,split,device_s[,launch_s]

A step row (``kind`` = ``prefill``, ``decode`` or ``mixed``) is one batch plan
that was run ``repeats`` times: its shape in ``StepShape``'s terms, the median
wall time of one step as the strict loop runs it (``duration_s``), the fastest
and slowest repeat, and the median device time of the step (``device_s``: its
period when launched back to back, as the overlapped loop runs it; see
``lab.profile.steps``). Files without the ``device_s`` column (written
before it existed) read it as ``duration_s``. The optional last column,
``launch_s``, is the median time the host spends in the step's launch (from
the upload of its inputs to the launch's return; empty where not measured): on
CPU the forward pass runs inside the launch, on a GPU the host launches
kernels the device runs meanwhile (``sim.model.scheduler_loop`` keeps the host
busy that long).
``split`` is ``fit`` for rows the ``table`` model is fitted to and ``holdout``
for rows kept out of the fit to measure its error. A CPU row (``kind`` =
``frontend``, ``tokenize``, ``detokenize``, ``ipc``, ``schedule``,
``schedule_request``; optional: ``tokenize_busy_N``, the back-to-back rate with N
tokenizers at once, ``BUSY_KINDS``) holds a per-unit cost in ``duration_s`` (see
``CpuCosts``), its shape columns zero, its ``device_s`` equal to ``duration_s``;
several rows of a kind are averaged. Copy rows (``COPY_KINDS``: ``copy_h2d``,
``copy_h2d_token``, ``copy_d2h``, ``copy_d2h_token``) are per-unit costs
too, of the host KV tier's copies (``sim.costs.copies``); they are optional, as are the
transfer rows (``TRANSFER_KINDS``: ``kv_transfer``, ``kv_transfer_token``) of prefill/decode
disaggregation's KV transfer (``sim.costs.transfer``).

Provenance is required: ``# key: value`` comment lines at the top of the file,
or a sidecar ``FILE.json`` with the same keys, naming at least ``hardware``,
``model``, ``date`` and ``command``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from core.scheduler.shape import StepShape
from sim.costs.base import CpuCosts

SHAPE_COLUMNS = tuple(f.name for f in fields(StepShape))
LEGACY_COLUMNS = ("kind", *SHAPE_COLUMNS, "tp", "duration_s", "min_s", "max_s", "repeats", "split")
COLUMNS = (*LEGACY_COLUMNS, "device_s")
LAUNCH_COLUMNS = (*COLUMNS, "launch_s")
STEP_KINDS = ("prefill", "decode", "mixed")
CPU_KINDS = CpuCosts.KINDS
BUSY_KINDS = tuple(f"tokenize_busy_{n}" for n in CpuCosts.BUSY_WORKERS)
COPY_KINDS = ("copy_h2d", "copy_h2d_token", "copy_d2h", "copy_d2h_token")
TRANSFER_KINDS = ("kv_transfer", "kv_transfer_token")
UNIT_KINDS = (*CPU_KINDS, *BUSY_KINDS, *COPY_KINDS, *TRANSFER_KINDS)
SPLITS = ("fit", "holdout")
REQUIRED_PROVENANCE = ("hardware", "model", "date", "command")


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file (and line)."""


@dataclass(frozen=True, slots=True)
class ProfileRow:
    """One measured row: a step plan's shape and times, or a CPU stage's per-unit cost."""

    kind: str
    shape: StepShape
    tp: int
    duration_s: float
    min_s: float
    max_s: float
    repeats: int
    split: str = "fit"
    device_s: float | None = None  # None: the wall time stands for it
    launch_s: float | None = None  # None: not measured

    @property
    def device_time(self) -> float:
        return self.duration_s if self.device_s is None else self.device_s

    @staticmethod
    def step_kind(shape: StepShape) -> str:
        if shape.prefill_tokens and shape.decode_requests:
            return "mixed"
        return "prefill" if shape.prefill_tokens else "decode"

    def cells(self) -> list[str]:
        shape = [str(getattr(self.shape, c)) for c in SHAPE_COLUMNS]
        times = [f"{t:.6e}" for t in (self.duration_s, self.min_s, self.max_s)]
        device = f"{self.device_time:.6e}"
        return [self.kind, *shape, str(self.tp), *times, str(self.repeats), self.split, device]

    def launch_cell(self) -> str:
        return "" if self.launch_s is None else f"{self.launch_s:.6e}"


EMPTY_SHAPE = StepShape(0, 0, 0, 0, 0, 0, 0)


@dataclass(slots=True)
class Profile:
    path: str
    provenance: dict[str, str]
    steps: list[ProfileRow] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)

    def provenance_text(self) -> str:
        return "; ".join(f"{k}: {v}" for k, v in self.provenance.items())


def display_path(path: Path | str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def write_profile(path: Path | str, provenance: dict[str, str], rows: list[ProfileRow]) -> None:
    """Write ``rows`` under ``# key: value`` provenance lines (one line per key)."""
    missing = [k for k in REQUIRED_PROVENANCE if not provenance.get(k)]
    if missing:
        raise ProfileError(f"{path}: provenance lacks {missing}")
    lines = [f"# {k}: {' '.join(str(v).split())}" for k, v in provenance.items()]
    if any(r.launch_s is not None for r in rows):
        lines.append(",".join(LAUNCH_COLUMNS))
        lines += [",".join([*r.cells(), r.launch_cell()]) for r in rows]
    else:
        lines.append(",".join(COLUMNS))
        lines += [",".join(r.cells()) for r in rows]
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _read_lines(path: Path) -> tuple[dict[str, str], list[tuple[int, str]]]:
    provenance: dict[str, str] = {}
    body: list[tuple[int, str]] = []
    with path.open("r", encoding="utf-8") as f:
        for line_no, text in enumerate(f, start=1):
            stripped = text.strip()
            if stripped.startswith("#"):
                key, sep, value = stripped.lstrip("#").partition(":")
                if sep:
                    provenance[key.strip()] = value.strip()
            elif stripped:
                body.append((line_no, stripped))
    sidecar = path.with_suffix(path.suffix + ".json")
    if sidecar.is_file():
        provenance.update({k: str(v) for k, v in json.loads(sidecar.read_text()).items()})
    missing = [k for k in REQUIRED_PROVENANCE if not provenance.get(k)]
    if missing:
        raise ProfileError(
            f"{path}: provenance lacks {missing} "
            f"(add '# key: value' header lines or {sidecar.name})"
        )
    return provenance, body


def _parse_row(where: str, cells: list[str], columns: int) -> ProfileRow:
    if len(cells) != columns:
        raise ProfileError(f"{where}: expected {columns} columns, got {len(cells)}")
    device = launch = None
    if columns == len(LAUNCH_COLUMNS):
        *cells, last = cells
        try:
            launch = float(last) if last.strip() else None
        except ValueError:
            raise ProfileError(f"{where}: non-numeric launch_s {last!r}") from None
        if launch is not None and not launch >= 0:
            raise ProfileError(f"{where}: launch_s must be >= 0")
    if columns >= len(COLUMNS):
        *cells, last = cells
        try:
            device = float(last)
        except ValueError:
            raise ProfileError(f"{where}: non-numeric device_s {last!r}") from None
        if not device >= 0:
            raise ProfileError(f"{where}: device_s must be >= 0")
    kind, split = cells[0].strip(), cells[-1].strip()
    if kind not in STEP_KINDS and kind not in UNIT_KINDS:
        raise ProfileError(f"{where}: unknown kind {kind!r}; known: {[*STEP_KINDS, *UNIT_KINDS]}")
    if split not in SPLITS:
        raise ProfileError(f"{where}: split must be one of {SPLITS}, got {split!r}")
    try:
        ints = [int(c) for c in cells[1 : 1 + len(SHAPE_COLUMNS) + 1]]
        median, low, high = (float(c) for c in cells[len(SHAPE_COLUMNS) + 2 : -2])
        repeats = int(cells[-2])
    except ValueError:
        raise ProfileError(f"{where}: non-numeric value in {cells[1:-1]}") from None
    if any(v < 0 for v in ints) or not all(t >= 0 for t in (median, low, high)) or repeats < 1:
        raise ProfileError(f"{where}: values must be >= 0 (repeats >= 1)")
    *shape, tp = ints
    if tp < 1:
        raise ProfileError(f"{where}: tp must be >= 1")
    return ProfileRow(
        kind, StepShape(*shape), tp, median, low, high, repeats, split, device, launch
    )


def read_profile(path: Path | str) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
    provenance, body = _read_lines(path)
    if not body:
        raise ProfileError(f"{path}: no header row")
    header_line, header = body[0]
    names = tuple(c.strip() for c in header.split(","))
    if names not in (LAUNCH_COLUMNS, COLUMNS, LEGACY_COLUMNS):
        raise ProfileError(f"{path}:{header_line}: expected header {','.join(LAUNCH_COLUMNS)}")
    steps: list[ProfileRow] = []
    cpu_rows: dict[str, list[float]] = {}
    lines = [n for n, _ in body[1:]]
    for line_no, cells in zip(lines, csv.reader(t for _, t in body[1:]), strict=True):
        row = _parse_row(f"{path}:{line_no}", cells, len(names))
        if row.kind in STEP_KINDS:
            steps.append(row)
        else:
            cpu_rows.setdefault(row.kind, []).append(row.duration_s)
    cpu = {k: sum(v) / len(v) for k, v in cpu_rows.items()}
    return Profile(path=display_path(path), provenance=provenance, steps=steps, cpu=cpu)


def profile_device(path: Path | str) -> str:
    """The ``device`` a profile was measured on (``cuda``, ``cuda:0``, ``cpu``; empty where it
    does not say), read from its provenance lines alone."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
    device = ""
    with path.open("r", encoding="utf-8") as f:
        for text in f:
            stripped = text.strip()
            if stripped and not stripped.startswith("#"):
                break
            key, sep, value = stripped.lstrip("#").partition(":")
            if sep and key.strip() == "device":
                device = value.strip()
    sidecar = path.with_suffix(path.suffix + ".json")
    if sidecar.is_file():
        device = str(json.loads(sidecar.read_text()).get("device", device))
    return device


def cpu_costs_from(profile: Profile, fallback: CpuCosts | None = None) -> CpuCosts:
    """CPU costs of ``profile``; kinds it lacks come from ``fallback`` (an error without one)."""
    values: dict[str, float] = {}
    for kind in CpuCosts.KINDS:
        if kind in profile.cpu:
            values[kind] = profile.cpu[kind]
        elif fallback is not None:
            values[kind] = getattr(fallback, kind)
        else:
            raise ProfileError(f"{profile.path}: no CPU cost row of kind {kind!r}")
    busy = tuple(
        (n, profile.cpu[kind])
        for n, kind in zip(CpuCosts.BUSY_WORKERS, BUSY_KINDS, strict=True)
        if kind in profile.cpu
    )
    if not busy and fallback is not None:
        busy = fallback.tokenize_busy
    source = profile.path if fallback is None else f"{profile.path} over {fallback.source}"
    provenance = profile.provenance_text()
    if fallback is not None and not set(CpuCosts.KINDS) <= profile.cpu.keys():
        provenance += f" | rest from {fallback.source}: {fallback.provenance}"
    return CpuCosts(**values, source=source, provenance=provenance, tokenize_busy=busy)
