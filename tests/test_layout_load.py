"""The arithmetic of ``benchmarks/layout_load.py`` on made-up validations: the points read
from ``comparison.json``, the winners and their ties, the tokenizer gains, the tables, and
the command line's errors. No server: the sweep itself is run by hand."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from layout_load import (
    Config,
    configs,
    gains,
    parse_args,
    point,
    points_table,
    summarize,
    validate_command,
    winner,
    winners_table,
)

from lab.validate.compare import LATENCIES, STATS, compare


def summary(scale: float, throughput: float) -> dict[str, Any]:
    """A run's summary: every latency statistic ``scale`` ms times its rank, the throughputs."""
    out: dict[str, Any] = {m: {q: scale * (i + 1) for i, q in enumerate(STATS)} for m in LATENCIES}
    return out | {"request_throughput": throughput, "output_throughput": 40 * throughput}


def made_point(layout: str, n: int, rate: float, real: list[float], sim: float) -> dict[str, Any]:
    """A sweep point from a comparison of real runs (throughputs ``real``) with a simulation."""
    comparison = compare([summary(100, r) for r in real], summary(90, sim))
    return {"layout": layout, "num_tokenizers": n, "rate_scale": rate} | point(comparison)


def entry(real: float, sim: float, noise: float | None = None) -> dict[str, Any]:
    return {"real": real, "sim": sim, "noise": noise}


def test_configs_skip_workers_outside_split() -> None:
    keep, skipped = configs(["split", "inline", "frontend"], [1, 2])
    assert keep == [Config("split", 1), Config("split", 2), Config("inline", 1),
                    Config("frontend", 1)]  # fmt: skip
    assert len(skipped) == 2 and "inline with 2" in skipped[0]


def test_point_reads_real_sim_error_and_noise() -> None:
    p = made_point("split", 1, 0.5, [1.0, 1.2], 1.21)
    tput = p["metrics"]["request_throughput"]
    assert tput["real"] == pytest.approx(1.1)
    assert tput["rel_err"] == pytest.approx(0.1)
    assert tput["noise"] == pytest.approx(0.2 / 1.1)
    ttft = p["metrics"]["ttft_ms.p99"]  # p99 is the 4th statistic: 400 real, 360 simulated
    assert (ttft["real"], ttft["sim"]) == (400, 360)
    assert ttft["rel_err"] == pytest.approx(-0.1)


def test_clear_winner_and_sim_agrees() -> None:
    w = winner({"a": entry(10, 9), "b": entry(12, 13)}, higher=True, tie_pct=3)
    assert (w["real"], w["tied"], w["sim"], w["agrees"]) == ("b", ["b"], "b", "yes")
    assert w["difference"] == pytest.approx(2 / 11)
    w = winner({"a": entry(10, 9), "b": entry(12, 13)}, higher=False, tie_pct=3)
    assert (w["real"], w["sim"], w["agrees"]) == ("a", "a", "yes")


def test_sim_picks_the_other_one() -> None:
    w = winner({"a": entry(10, 14), "b": entry(12, 13)}, higher=True, tie_pct=3)
    assert (w["real"], w["sim"], w["agrees"]) == ("b", "a", "no")


def test_tie_within_tie_pct_with_one_repeat() -> None:
    entries = {"a": entry(100, 90), "b": entry(102, 80), "c": entry(90, 100)}
    w = winner(entries, higher=True, tie_pct=3)
    assert w["tied"] == ["b", "a"] and w["threshold_from"] == "--tie-pct"
    assert (w["sim"], w["agrees"]) == ("c", "no")
    w = winner(entries, higher=True, tie_pct=1)  # 2 % apart: no longer a tie
    assert w["tied"] == ["b"]


def test_tie_follows_the_real_runs_spread() -> None:
    # 10 % apart, beyond --tie-pct but within the larger spread of the two between repeats
    entries = {"a": entry(100, 100, noise=0.02), "b": entry(110, 101, noise=0.15)}
    w = winner(entries, higher=True, tie_pct=3)
    assert w["threshold"] == 0.15 and w["threshold_from"] == "real runs' spread"
    assert w["tied"] == ["b", "a"] and w["sim_tied"] == ["b", "a"] and w["agrees"] == "yes"
    entries["b"]["noise"] = 0.05
    w = winner(entries, higher=True, tie_pct=3)
    assert w["tied"] == ["b"] and w["sim_tied"] == ["b", "a"] and w["agrees"] == "partly"


def test_each_label_ties_by_its_own_spread() -> None:
    """A third configuration whose runs spread widely ties with the best, while one close
    by with steady runs does not (the top two's spreads alone would miss both)."""
    entries = {
        "a": entry(100, 100, noise=0.01),
        "b": entry(102, 100, noise=0.01),
        "c": entry(90, 100, noise=0.2),
    }
    w = winner(entries, higher=True, tie_pct=3)
    assert w["tied"] == ["b", "c"] and w["threshold"] == 0.2


def test_winners_only_with_several_layouts_and_gains_only_with_several_counts() -> None:
    n1 = made_point("split", 1, 0.3, [1.0], 1.0)
    n2 = made_point("split", 2, 0.3, [1.25], 1.1)
    found = summarize([n1, n2], tie_pct=3)
    assert found["winners"] == [] and len(found["gains"]) == 1
    g = found["gains"][0]
    assert (g["num_tokenizers"], g["over"]) == (2, 1)
    assert g["real"] == pytest.approx(0.25) and g["sim"] == pytest.approx(0.1)
    assert g["error"] == pytest.approx(-0.15)
    inline = made_point("inline", 1, 0.3, [0.8], 0.9)
    found = summarize([n1, inline], tie_pct=3)
    assert found["gains"] == [] and len(found["winners"]) == 3
    tput = found["winners"][0]
    assert (tput["metric"], tput["real"], tput["sim"]) == (
        "output_throughput",
        "split_n1",
        "split_n1",
    )


def test_gains_per_layout_and_rate_over_the_smallest_count() -> None:
    points = [made_point("split", n, r, [1.0 + n / 10 + r], 1.0) for n in (4, 1, 2) for r in (1, 2)]
    rows = gains(points)
    assert [(g["rate_scale"], g["num_tokenizers"], g["over"]) for g in rows] == [
        (1, 2, 1), (1, 4, 1), (2, 2, 1), (2, 4, 1)]  # fmt: skip
    assert rows[1]["real"] == pytest.approx(2.4 / 2.1 - 1) and rows[1]["sim"] == 0


def test_tables_show_values_ties_and_failures() -> None:
    points = [made_point("split", 1, 0.3, [1.0], 1.0), made_point("inline", 1, 0.3, [1.01], 1.2)]
    points.append({"layout": "frontend", "num_tokenizers": 1, "rate_scale": 0.3,
                   "error": "sim validate exited 2"})  # fmt: skip
    table = points_table(points).splitlines()
    assert len(table) == 5 and "| inline | 1 | 0.3 | 1.010 | 1.200 | +18.8% |" in table[3]
    assert "sim validate exited 2" in table[4]
    text = winners_table(summarize(points, tie_pct=3)["winners"])
    assert "| 0.3 | tok/s | tie: inline_n1, split_n1 |" in text and "| inline_n1 | partly |" in text


def test_validate_command_passes_flags_through(tmp_path: Path) -> None:
    trace, profile = tmp_path / "t.csv", tmp_path / "p.csv"
    trace.touch()
    profile.touch()
    args = parse_args(["--trace", str(trace), "--profile", str(profile), "--limit", "5",
                       "--validate-args", "--max-running 8"])  # fmt: skip
    cmd = validate_command(args, Config("split", 2), 0.5, "http://h:1", tmp_path / "o")
    text = " ".join(cmd)
    assert "--num-tokenizers 2" in text and "--rate-scale 0.5" in text and "--limit 5" in text
    assert cmd[-2:] == ["--max-running", "8"] and "--tokenizer" not in cmd
    assert args.json == Path("out/layout_load/layout_load.json") and args.repeats == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layouts", "split,pipeline"], "unknown layout ['pipeline']"),
        (["--rates", "0.5,fast"], "--rates takes comma-separated numbers"),
        (["--num-tokenizers", "0"], "--num-tokenizers takes positive numbers"),
        (["--repeats", "0"], "--repeats and --limit must be >= 1"),
        (["--cpu-profile", "missing.csv"], "--cpu-profile: no file missing.csv"),
    ],
)
def test_bad_input_is_one_line(tmp_path: Path, extra: list[str], message: str) -> None:
    trace, profile = tmp_path / "t.csv", tmp_path / "p.csv"
    trace.touch()
    profile.touch()
    with pytest.raises(SystemExit) as exc:
        parse_args(["--trace", str(trace), "--profile", str(profile), *extra])
    assert message in str(exc.value.code) and "\n" not in str(exc.value.code)


def test_missing_trace_or_profile(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="--trace: no file"):
        parse_args(["--trace", str(tmp_path / "t.csv"), "--profile", str(tmp_path)])
    (tmp_path / "t.csv").touch()
    with pytest.raises(SystemExit, match="--profile: no file"):
        parse_args(["--trace", str(tmp_path / "t.csv"), "--profile", str(tmp_path / "p.csv")])
