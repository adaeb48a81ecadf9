"""Profile files: measured step times and CPU stage costs, with their provenance.

CSV columns ``kind,prefill_tokens,decode_requests,context_tokens,tp,duration_s``.
GPU rows (``kind`` = ``prefill``, ``decode``, ``mixed`` or ``step``) hold one
measured step each. CPU rows (``kind`` = ``frontend``, ``tokenize``,
``detokenize``, ``ipc``, ``schedule``, ``schedule_request``) hold a per-unit cost
in ``duration_s`` (see ``CpuCosts``); several rows of a kind are averaged.

Provenance is required: ``# key: value`` comment lines at the top of the file,
or a sidecar ``FILE.json`` with the same keys, naming at least ``hardware``,
``model``, ``date`` and ``command``.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.costs.base import CpuCosts

COLUMNS = ["kind", "prefill_tokens", "decode_requests", "context_tokens", "tp", "duration_s"]
GPU_KINDS = frozenset({"prefill", "decode", "mixed", "step"})
CPU_KINDS = frozenset(CpuCosts.KINDS)
REQUIRED_PROVENANCE = ("hardware", "model", "date", "command")


class ProfileError(ValueError):
    """A profile file that cannot be used; the message names the file (and line)."""


@dataclass(slots=True)
class Profile:
    path: str
    provenance: dict[str, str]
    gpu: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))  # pt, dr, ctx, tp, dur
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


def read_profile(path: Path | str) -> Profile:
    path = Path(path)
    if not path.is_file():
        raise ProfileError(f"{path}: no such profile file")
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
    if not body:
        raise ProfileError(f"{path}: no header row")
    header_line, header = body[0]
    if [c.strip() for c in header.split(",")] != COLUMNS:
        raise ProfileError(f"{path}:{header_line}: expected header {','.join(COLUMNS)}")
    gpu_rows: list[list[float]] = []
    cpu_sum: dict[str, list[float]] = {}
    for line_no, cells in zip(
        (n for n, _ in body[1:]), csv.reader(t for _, t in body[1:]), strict=True
    ):
        if len(cells) != len(COLUMNS):
            raise ProfileError(f"{path}:{line_no}: expected {len(COLUMNS)} columns")
        kind = cells[0].strip()
        try:
            nums = [float(c) for c in cells[1:]]
        except ValueError:
            raise ProfileError(f"{path}:{line_no}: non-numeric value in {cells[1:]}") from None
        if any(v < 0 or v != v for v in nums):
            raise ProfileError(f"{path}:{line_no}: values must be >= 0")
        if kind in GPU_KINDS:
            gpu_rows.append(nums)
        elif kind in CPU_KINDS:
            cpu_sum.setdefault(kind, []).append(nums[4])
        else:
            raise ProfileError(
                f"{path}:{line_no}: unknown kind {kind!r}; known: {sorted(GPU_KINDS | CPU_KINDS)}"
            )
    gpu = np.array(gpu_rows, dtype=np.float64).reshape(-1, 5)
    cpu = {k: float(np.mean(v)) for k, v in cpu_sum.items()}
    return Profile(path=display_path(path), provenance=provenance, gpu=gpu, cpu=cpu)


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
    source = profile.path if fallback is None else f"{profile.path} over {fallback.source}"
    provenance = profile.provenance_text()
    if fallback is not None and len(profile.cpu) < len(CpuCosts.KINDS):
        provenance += f" | rest from {fallback.source}: {fallback.provenance}"
    return CpuCosts(**values, source=source, provenance=provenance)
