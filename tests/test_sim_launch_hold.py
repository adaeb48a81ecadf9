"""A launch that holds the host: the profile's ``launch_s``, its fit, and the overlapped loop.

On CPU the forward pass runs inside the launch, so an overlapped engine forms step N+1 only
after step N's compute and completes step N only after launching N+1. The simulator follows
where the profile measured the launch: these tests check the column's round trip, the fit,
that fast-forwarded decode runs price exactly what stepping one by one does, and what the
hold changes (each token leaves a step later; requests joining in flight see the loop's
real phase).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from schema.traces import load_trace
from sim.config import build_config
from sim.costs.profile import EMPTY_SHAPE, ProfileError, ProfileRow, read_profile, write_profile
from sim.costs.table import TableCostModel
from sim.replay import ReplayResult, run_replay

CPU_PROFILE = Path(__file__).resolve().parents[1] / "profiles/cpu-xeon-2core_smollm2-135m.csv"


def held_profile(tmp_path: Path, factor: float | None, name: str = "held.csv") -> Path:
    """The committed CPU profile with every step row's launch at ``factor`` x its wall time
    (None: the column left out)."""
    profile = read_profile(CPU_PROFILE)
    steps = [
        dataclasses.replace(r, launch_s=None if factor is None else r.duration_s * factor)
        for r in profile.steps
    ]
    units = [ProfileRow(kind, EMPTY_SHAPE, 1, v, v, v, 1) for kind, v in profile.cpu.items()]
    out = tmp_path / name
    write_profile(out, profile.provenance, steps + units)
    return out


def replay(
    tmp_path: Path, profile: Path, rows: list[dict[str, object]], **config: object
) -> ReplayResult:
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    values = {"model": "smollm2-135m", "profile": str(profile), "cost_model": "table"}
    cfg = build_config(**(values | {"overlap": True} | config))
    return run_replay(load_trace(path), cfg, progress=False)


def test_launch_column_round_trips_and_old_files_still_read(tmp_path: Path) -> None:
    held = read_profile(held_profile(tmp_path, 1.0))
    assert all(r.launch_s == pytest.approx(r.duration_s, rel=1e-6) for r in held.steps)
    plain = read_profile(held_profile(tmp_path, None, "plain.csv"))
    assert all(r.launch_s is None for r in plain.steps)
    assert (tmp_path / "plain.csv").read_text().count("launch_s") == 0
    text = (tmp_path / "held.csv").read_text()
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("decode,"))
    lines[row] = lines[row].rsplit(",", 1)[0] + ",-1"
    bad = tmp_path / "bad.csv"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(ProfileError, match="launch_s must be >= 0"):
        read_profile(bad)
    lines[row] = lines[row].rsplit(",", 1)[0] + ","  # empty: not measured
    bad.write_text("\n".join(lines) + "\n")
    assert sum(r.launch_s is None for r in read_profile(bad).steps) == 1


def test_the_table_fits_launches_only_where_every_row_has_one(tmp_path: Path) -> None:
    held = read_profile(held_profile(tmp_path, 0.5))
    model = TableCostModel(held)
    for row in held.steps[:20]:
        assert model.launch_time(row.shape) == pytest.approx(0.5 * model.step_time(row.shape))
    runs = model.decode_launch_times(4, 400, 100, 8)
    assert runs is not None
    assert np.allclose(runs, 0.5 * model.decode_times(4, 400, 100, 8))
    plain = TableCostModel(read_profile(held_profile(tmp_path, None, "plain.csv")))
    assert plain.launch_time(held.steps[0].shape) is None
    assert plain.decode_launch_times(4, 400, 100, 8) is None


def staggered(n: int, output: int) -> list[dict[str, object]]:
    return [
        {"timestamp": 50 * i, "input_length": 30 + 7 * i, "output_length": output} for i in range(n)
    ]


@pytest.mark.parametrize("n", [1, 3])
def test_fast_forward_prices_a_held_loop_as_stepping_does(tmp_path: Path, n: int) -> None:
    profile = held_profile(tmp_path, 1.0)
    rows = staggered(n, 40)
    stepped = replay(tmp_path, profile, rows, fast_forward=False).requests
    forward = replay(tmp_path, profile, rows, fast_forward=True).requests
    for column in ("ttft_ms", "e2e_ms", "tpot_ms"):
        assert np.allclose(stepped[column], forward[column], rtol=1e-9, atol=1e-9), column


def test_a_held_launch_delays_each_token_by_the_next_step(tmp_path: Path) -> None:
    """One request: with the forward pass inside the launch, the host completes step N only
    after launching (computing) step N+1, so each token but the last leaves a decode step
    later, and the loop's period is its scheduling plus the whole step, as strict
    alternation's."""
    rows = staggered(1, 30)
    free = replay(tmp_path, held_profile(tmp_path, None, "plain.csv"), rows).requests
    held = replay(tmp_path, held_profile(tmp_path, 1.0), rows).requests
    strict = replay(
        tmp_path, held_profile(tmp_path, None, "strict.csv"), rows, overlap=False
    ).requests
    late = float(held["ttft_ms"][0]) - float(free["ttft_ms"][0])
    assert 0.9 < late / float(free["tpot_ms"][0]) < 1.1  # the first token waits a decode step
    # the last token does not (nothing is launched after it): same end as strict alternation
    assert float(held["e2e_ms"][0]) == pytest.approx(float(strict["e2e_ms"][0]), rel=1e-3)
