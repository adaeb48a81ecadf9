"""The output files of a run, real (``engine bench``) or simulated (``sim replay``).

In ``out_dir``: ``requests.csv``, the step table (``steps.csv`` by default, the
compact ``steps.parquet`` on request, or none), ``queues.csv``, ``summary.json``,
and ``report.html``; ``write_step_record`` adds the step record
``engine_steps.csv`` (``schema.steprecord``) of a run that kept one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from lab.report import write_report
from lab.report.plotlyjs import INLINE, PlotlyJs
from schema.jsonsafe import json_safe
from schema.run import RunResult
from schema.steprecord import STEP_RECORD_NAME
from schema.tables import STEP_FORMATS, write_csv, write_parquet

REQUESTS_NAME = "requests.csv"


def step_table_name(fmt: str) -> str:
    """The step table's file name in ``fmt`` (``csv`` or ``parquet``)."""
    return f"steps.{fmt}"


def write_steps(steps: pd.DataFrame, out_dir: Path, fmt: str) -> None:
    """The step table in ``fmt`` (one of ``STEP_FORMATS``)."""
    if fmt == "parquet":
        write_parquet(steps, out_dir / step_table_name(fmt))
    elif fmt == "csv":
        write_csv(steps, out_dir / step_table_name(fmt))
    elif fmt != "none":
        raise ValueError(f"unknown step table format {fmt!r}; known: {list(STEP_FORMATS)}")


def write_step_record(engine_steps: pd.DataFrame | None, out_dir: Path) -> None:
    """``engine_steps.csv`` in ``out_dir``, where the run kept a step record."""
    if engine_steps is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_csv(engine_steps, out_dir / STEP_RECORD_NAME)


def write_outputs(
    result: RunResult,
    out_dir: Path,
    *,
    report: bool = True,
    steps: str = "csv",
    written: frozenset[str] = frozenset(),
    plotlyjs: PlotlyJs = INLINE,
) -> dict[str, Any]:
    """Write the output files, but for the tables already ``written`` as the run went
    (``requests``, ``steps``); return the summary (with the verdict when a report was made:
    the report reads the request and step tables in memory; ``plotlyjs``: how it loads
    plotly.js)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    if "requests" not in written:
        write_csv(result.requests, out_dir / REQUESTS_NAME)
    if "steps" not in written:
        write_steps(result.steps, out_dir, steps)
    write_csv(result.queues, out_dir / "queues.csv")
    summary = result.summary
    if report:
        verdict = write_report(
            out_dir, summary, result.requests, result.steps, result.queues, result.itl_s, plotlyjs
        )
        summary["bottleneck"] = json_safe(verdict)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
