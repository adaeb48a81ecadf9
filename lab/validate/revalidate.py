"""``sim validate --real-from DIR [DIR ...]``: simulate again the real runs earlier ``sim
validate`` runs recorded in each ``DIR``, with another ``--profile``, without a server.

The trace slice (rate scale, limit, the requests the server could take) and the
simulator's config come from the first ``DIR/comparison.json`` (every folder must
have run the same slice: their real runs are then repeats of one measurement); only the profile (its
``table`` model, CPU costs and dtype) and, if given, ``--overlap``, ``--colocation``,
``--cpu-profile`` (the CPU stage costs of a profile measured on the runs' host) and the keys
of a ``--config`` file change. The
real side is each ``DIR/real-N``'s ``summary.json`` and ``requests.csv``, so
``comparison.json`` has the same keys as a live validation; the HTML report,
which needs the real runs' inter-token gaps, is not written.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pandas as pd

from schema.traces import Trace, load_trace
from sim.config import CONFIG_KEYS, SimConfig, build_config, read_config_file
from sim.costs.committed import profile_dtype

Recorded = tuple[dict[str, Any], pd.DataFrame]  # a real run's summary and requests


def recorded_runs(folders: list[Path]) -> tuple[dict[str, Any], list[Recorded], list[Path]]:
    """The ``run`` record of the first folder's ``comparison.json``, and each real run of
    every folder (its summary, its requests, its folder ``real-N``). The folders must have
    run the same slice of the same trace (repeats measured another day, say)."""
    first: dict[str, Any] | None = None
    runs: list[Recorded] = []
    paths: list[Path] = []
    for folder in folders:
        path = folder / "comparison.json"
        if not path.is_file():
            raise ValueError(f"{folder} holds no comparison.json of an earlier sim validate")
        run = json.loads(path.read_text())["run"]
        if first is None:
            first = run
        elif run["trace"] != first["trace"]:
            raise ValueError(
                f"{folder} ran {run['trace']}, {folders[0]} ran {first['trace']}: "
                "only runs of one trace slice compare together"
            )
        for i in range(1, int(run["repeats"]) + 1):
            real = folder / f"real-{i}"
            summary = json.loads((real / "summary.json").read_text())
            runs.append((summary, pd.read_csv(real / "requests.csv", dtype={"rid": str})))
            paths.append(real)
    assert first is not None  # argparse gives one folder at least
    return first, runs, paths


def recorded_trace(args: argparse.Namespace, run: dict[str, Any], served: pd.DataFrame) -> Trace:
    """``args.trace`` sliced as the recorded run sliced it, with only the requests it sent."""
    spec = run["trace"]
    if Path(spec["path"]) != Path(args.trace):
        raise ValueError(f"{args.real_from[0]} recorded {spec['path']}, not {args.trace}")
    trace = load_trace(args.trace, rate_scale=spec["rate_scale"], limit=spec["limit"])
    sent = set(served["rid"])
    return replace(trace, requests=[r for r in trace.requests if r.rid in sent])


def recorded_config(args: argparse.Namespace, run: dict[str, Any]) -> SimConfig:
    """The recorded simulator config with ``--profile`` (and ``--overlap``, ``--colocation``,
    ``--cpu-profile``, ``--tokenize-busy`` and the ``--config`` file's keys, if given)."""
    values = {k: v for k, v in run["sim_config"].items() if k in CONFIG_KEYS}
    if args.config is not None:
        values |= read_config_file(args.config)
    # records from before the key: replicas came only from engine serve --dp, one frontend
    values.setdefault("shared_frontend", values.get("replicas", 1) > 1)
    values |= {"profile": args.profile, "cost_model": "table", "dtype": profile_dtype(args.profile)}
    if args.overlap is not None:
        values["overlap"] = args.overlap
    if args.colocation is not None:
        values["colocation"] = args.colocation
    if args.cpu_profile is not None:
        values["cpu_profile"] = args.cpu_profile
    if args.tokenize_busy is not None:
        values["tokenize_busy"] = args.tokenize_busy
    return build_config(None, **values)
