"""Sweep grids: a TOML file of knobs, expanded to the Cartesian product of their values.

Every key is a ``SimConfig`` field (the same names as a ``--config`` file, and
the same optional tables ``[scheduler]``, ``[model]``, ``[costs]``,
``[pipeline]``) or ``rate_scale``. A list gives the values to sweep, a scalar
fixes the knob::

    policy = ["fcfs", "sjf"]
    max_running = [64, 256]
    rate_scale = [1, 2, 4]

    [pipeline]
    num_tokenizers = [1, 2]

expands to 2 x 2 x 3 x 2 = 24 configurations, in file order with the last key
varying fastest. A name that is neither a field nor ``rate_scale`` or ``cluster`` is
an error that lists the known names, so a knob added to ``SimConfig`` later is
sweepable by its name at once.

``cluster`` names the servers: ``"N"`` (or N) colocated replicas, ``"P:D"`` P prefill and D
decode replicas (disaggregated), so that one knob sets ``replicas``, ``prefill_replicas``
and ``decode_replicas`` together: ``cluster = ["4", "1:3", "2:2", "3:1"]`` compares four
servers colocated with each split of four.
"""

from __future__ import annotations

import itertools
import tomllib
from pathlib import Path
from typing import Any

from sim.config import CONFIG_KEYS, SECTIONS

RATE_SCALE = "rate_scale"
"""A knob that is not a ``SimConfig`` field: arrivals are divided by it."""
CLUSTER = "cluster"
"""A knob that is not a ``SimConfig`` field: the servers (``cluster_fields``)."""


def knob_names() -> list[str]:
    return sorted(CONFIG_KEYS | {RATE_SCALE, CLUSTER})


def cluster_fields(value: object) -> dict[str, int]:
    """The ``SimConfig`` fields of a ``cluster`` value: ``N`` colocated replicas, or ``P:D``
    prefill and decode replicas; ``ValueError`` for anything else."""
    text = str(value).strip()
    try:
        parts = [int(v) for v in text.split(":")]
    except ValueError:
        parts = []
    if len(parts) == 1 and parts[0] >= 1:
        return {"replicas": parts[0], "prefill_replicas": 0, "decode_replicas": 0}
    if len(parts) == 2 and min(parts) >= 1:
        return {"replicas": 1, "prefill_replicas": parts[0], "decode_replicas": parts[1]}
    raise ValueError(
        f"cluster takes N (replicas) or P:D (prefill and decode replicas), got {value!r}"
    )


def read_grid(path: Path | str) -> dict[str, list[Any]]:
    """The knobs of a grid file, each with its list of values (a scalar becomes one value)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such grid file")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: cannot parse the grid as TOML ({exc})") from None
    flat: dict[str, Any] = {}
    for key, value in raw.items():
        items = value.items() if key in SECTIONS and isinstance(value, dict) else [(key, value)]
        for name, v in items:
            if name in flat:
                raise ValueError(f"{path}: knob {name!r} is given twice")
            flat[name] = v
    return check_grid(flat, where=str(path))


def check_grid(knobs: dict[str, Any], where: str = "grid") -> dict[str, list[Any]]:
    """Knob values as lists; unknown names, nested tables and empty lists are errors."""
    known = knob_names()
    unknown = sorted(set(knobs) - set(known))
    if unknown:
        raise ValueError(f"{where}: unknown knobs {unknown}; known: {known}")
    grid: dict[str, list[Any]] = {}
    for name, value in knobs.items():
        values = list(value) if isinstance(value, list) else [value]
        if not values:
            raise ValueError(f"{where}: knob {name!r} has an empty list of values")
        if any(isinstance(v, dict | list) for v in values):
            raise ValueError(f"{where}: knob {name!r} takes scalar values, got {value!r}")
        grid[name] = values
    return grid


def expand(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """The Cartesian product of the values: one dict of knob values per configuration."""
    names = list(grid)
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid.values())]


def swept(grid: dict[str, list[Any]]) -> list[str]:
    """The knobs that take more than one value."""
    return [name for name, values in grid.items() if len(values) > 1]
