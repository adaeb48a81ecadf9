"""``engine profile`` on SmolLM2/CPU, prompts of exact lengths, and ``sim validate`` against a
live server, end to end."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
import torch
from conftest import MODEL, Server

from engine.runner.hardware import hardware as machine
from lab.bench.prompts import PromptMaker, fresh_salt
from lab.cli.sim import main as sim_main
from lab.profile.main import profile_main
from lab.validate.command import hardware_warning
from lab.validate.regime import REGIMES
from schema.traces import TraceRequest, generate
from sim.costs import TableCostModel, load_cpu_costs, read_profile
from sim.costs.base import CpuCosts
from sim.costs.copies import copy_costs
from sim.costs.presets import hardware
from sim.costs.profile import COPY_KINDS, TRANSFER_KINDS

pytestmark = pytest.mark.slow
TINY_GRID = [
    "--prefill-tokens", "16,64", "--prefill-prefixes", "0,32", "--prefill-chunks", "1,2",
    "--decode-batches", "1,4", "--decode-contexts", "16,64", "--mixed-prefill", "16",
    "--mixed-batches", "2", "--holdout", "3", "--repeats", "1", "--stage-repeats", "1",
]  # fmt: skip


@pytest.fixture(scope="module")
def profile(model_ready: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("profile") / "cpu_smollm2.csv"
    argv = ["--model", MODEL, "--cpu-threads", "1", "--num-pages", "256", "--scatter-pages",
            *TINY_GRID]  # fmt: skip
    assert profile_main([*argv, "--out", str(out)]) == 0
    return out


def test_engine_profile_writes_a_valid_profile(profile: Path) -> None:
    p = read_profile(profile)
    assert p.provenance["model"].startswith(MODEL) and p.provenance["device"] == "cpu"
    assert p.provenance["attention_backend"] == "torch" and p.provenance["tp"] == "1"
    assert "torch" in p.provenance["software"]
    assert "holdout error over 3" in p.provenance["table_fit"]
    assert p.provenance["grid"].endswith("pages=scattered")
    kinds = {r.kind for r in p.steps}
    assert kinds == {"prefill", "decode", "mixed"}
    assert sum(r.split == "holdout" for r in p.steps) == 3
    assert all(0 < r.min_s <= r.duration_s <= r.max_s < 5 for r in p.steps)
    busy = [n for n in CpuCosts.BUSY_WORKERS if n <= (os.cpu_count() or 1)]
    busy_kinds = {f"tokenize_busy_{n}" for n in busy}
    assert set(p.cpu) == set(CpuCosts.KINDS) | busy_kinds | set(COPY_KINDS) | set(TRANSFER_KINDS)
    assert p.cpu["kv_transfer_token"] > 0 and "KVSender" in p.provenance["transfer"]
    copies = copy_costs(p, hardware("h200"), 1.0)  # the profile's rows, not the preset's link
    assert copies.source == p.path and copies.load_per_token > 0 and copies.write_per_token > 0
    table = TableCostModel(p)
    assert table.errors["holdout"]["rows"] == 3
    bigger = max(p.steps, key=lambda r: r.shape.prefill_tokens).shape
    smaller = min(p.steps, key=lambda r: r.shape.prefill_tokens + r.shape.decode_requests).shape
    assert table.step_time(bigger) > table.step_time(smaller)
    cpu = load_cpu_costs(p)
    assert 0 < cpu.tokenize < 1e-3 and 0 < cpu.stream < 0.05 and cpu.source == str(profile)
    # back to back, each count of workers that fits the cores; one worker faster than idle
    assert [n for n, _ in cpu.tokenize_busy] == busy
    assert all(0 < rate < 1e-3 for _, rate in cpu.tokenize_busy)
    assert cpu.tokenize_busy[0][1] < cpu.tokenize


def test_engine_profile_reports_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        profile_main(["--model", "no-such-model", "--no-steps", "--out", "/nonexistent/p.csv"])
    assert "no-such-model" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            profile_main(["--model", MODEL, "--device", "cuda", "--out", "/nonexistent/p.csv"])
        assert "needs as many CUDA devices" in capsys.readouterr().err


def test_prompts_have_exact_lengths_and_shared_blocks(model_ready: str) -> None:
    from engine.tokenizer.prompt import load_tokenizer

    tokenizer = load_tokenizer(model_ready)
    maker = PromptMaker(tokenizer)
    a = TraceRequest("a", 0.0, 1200, 1, hash_ids=(7, 8, 9))
    b = TraceRequest("b", 0.0, 700, 1, hash_ids=(7, 5))
    c = TraceRequest("c", 0.0, 33, 1)
    ids = {r.rid: tokenizer.encode(maker.text(r)) for r in (a, b, c)}
    assert [len(ids[k]) for k in "abc"] == [1200, 700, 33]
    assert ids["a"][:512] == ids["b"][:512] and ids["a"][512] != ids["b"][512]
    assert maker.text(c) == maker.text(c) != maker.text(TraceRequest("d", 0.0, 33, 1))
    # another salt: no shared text with this run, blocks included; the same salt: the same text
    other = PromptMaker(tokenizer, fresh_salt())
    assert tokenizer.encode(other.text(a))[1:8] != ids["a"][1:8]
    assert other.text(b) != maker.text(b) and PromptMaker(tokenizer).text(b) == maker.text(b)


def test_completions_carry_stage_timestamps_on_request(server: Server) -> None:
    body = {"model": MODEL, "prompt": "Hello there", "max_tokens": 3, "ignore_eos": True,
            "stream": True, "return_meta_info": True}  # fmt: skip
    chunks = []
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
    last = chunks[-1]
    assert last["choices"][0]["finish_reason"] == "length"
    meta = last["meta_info"]
    assert meta["received"] <= meta["tokenized"] <= meta["first_scheduled"] <= meta["finished"]
    assert len(meta["token_times"]) == 3 and "meta_info" not in chunks[0]
    assert meta["replica"] == 0  # one replica
    url = f"{server.url}/v1/completions"
    plain = httpx.post(url, json=body | {"stream": False}, timeout=60).json()
    assert plain["meta_info"]["completion_tokens"] == 3
    body |= {"return_meta_info": False, "stream": False}
    assert "meta_info" not in httpx.post(url, json=body, timeout=60).json()


def test_sim_validate_end_to_end(
    server: Server, profile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "short.jsonl"
    generate(trace, arrival="poisson", rate=4.0, input_spec="uniform:8:64",
             output_spec="uniform:2:8", num=6, seed=11)  # fmt: skip
    out = tmp_path / "validate"
    args = ["validate", str(trace), "--url", server.url, "--profile", str(profile),
            "--repeats", "2", "--out", str(out), "--no-progress"]  # fmt: skip
    assert sim_main(args) == 0
    comparison = json.loads((out / "comparison.json").read_text())
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for q in ("mean", "p50", "p90", "p99"):
            e = comparison[key][q]
            assert e["real"] > 0 and e["sim"] > 0 and len(e["real_runs"]) == 2
            assert e["rel_err"] == pytest.approx(e["sim"] / e["real"] - 1)
            assert e["noise"] is not None
    for part in ("to_tokenized_ms", "to_scheduled_ms", "to_first_token_ms"):
        e = comparison["ttft_parts"][part]["p50"]
        assert e["real"] > 0 and e["sim"] > 0 and len(e["real_runs"]) == 2
    assert comparison["run"]["sim_config"]["num_pages"] == 1024  # read from /metrics
    here = machine("cpu", 1)  # the server and the profile were both measured here
    assert comparison["run"]["server_hardware"] == comparison["run"]["profile_hardware"] == here
    regime = comparison["regime"]
    assert len(regime["real_runs"]) == 2 and regime["real"] in REGIMES
    printed = capsys.readouterr()
    assert regime["sim"]["regime"] in REGIMES and "regime: real run: " in printed.out
    # no hardware warning (the tiny grid is exceeded, so the reach warning may print)
    assert "was measured on" not in printed.err
    again = tmp_path / "again"  # the recorded real runs, simulated again without the server
    args = ["validate", str(trace), "--real-from", str(out), "--profile", str(profile),
            "--out", str(again), "--no-progress"]  # fmt: skip
    assert sim_main(args) == 0
    redo = json.loads((again / "comparison.json").read_text())
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        assert redo[key]["p90"]["real_runs"] == comparison[key]["p90"]["real_runs"]
        assert redo[key]["p90"]["sim"] == pytest.approx(comparison[key]["p90"]["sim"])
    assert redo["run"]["real_from"] == [str(out)] and redo["run"]["sim_config"]["num_pages"] == 1024
    both = tmp_path / "both"  # runs of another day's folder count as repeats of the same slice
    twice = [*args[:3], str(out), str(out), *args[4:7], str(both), "--no-progress"]
    assert sim_main(twice) == 0
    pooled = json.loads((both / "comparison.json").read_text())["ttft_ms"]["p90"]["real_runs"]
    assert pooled == 2 * comparison["ttft_ms"]["p90"]["real_runs"]
    assert "--rate-scale" not in redo["run"]["command"] and "--profile" in redo["run"]["command"]
    assert not (again / "report.html").exists()
    neither = ["validate", str(trace), "--profile", str(profile), "--out", str(tmp_path / "x")]
    assert sim_main(neither) == 2
    assert sim_main([*neither, "--real-from", str(tmp_path)]) == 2  # no comparison.json there
    other = Path(__file__).resolve().parents[1] / "traces" / "azure_code.csv"
    assert sim_main([*args[:1], str(other), *args[2:]]) == 2  # not the trace it recorded
    assert comparison["run"]["profile"] == str(profile)
    for run in ("real-1", "real-2", "sim"):
        summary = json.loads((out / run / "summary.json").read_text())
        assert summary["completed"] == 6
        timeline = json.loads((out / run / "timeline.json").read_text())
        assert any(e["ph"] == "X" and e["pid"] == 2 for e in timeline["traceEvents"])
    real = json.loads((out / "real-1" / "summary.json").read_text())
    assert real["bench"]["server_timestamps"] and real["bench"]["prompt_length_mismatches"] == 0
    assert (out / "report.html").stat().st_size > 100_000


def test_validate_simulates_the_server_s_overlap_mode(server: Server, profile: Path) -> None:
    import argparse

    from lab.bench.server import server_info
    from lab.validate.command import add_validate_args, sim_config

    info = server_info(server.url)
    assert info.overlap is False  # a CPU server overlaps only when told to
    parser = argparse.ArgumentParser()
    add_validate_args(parser.add_subparsers())
    base = ["validate", "t.jsonl", "--url", server.url, "--profile", str(profile), "--out", "o"]
    for flags, server_says, simulated in (
        ([], True, True),
        ([], False, False),
        (["--no-overlap"], True, False),
        (["--overlap"], False, True),
    ):
        args = parser.parse_args([*base, *flags])
        config = sim_config(args, replace(info, overlap=server_says), 1024)
        assert config.overlap is simulated, (flags, server_says)


def test_a_profile_of_other_hardware_is_named_before_a_validation() -> None:
    """``sim validate`` warns when the profile's header names other hardware than the server's
    model card: a profile of another CPU or GPU prices steps that machine's way."""
    xeon = Path(__file__).resolve().parents[1] / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    measured = read_profile(xeon).provenance["hardware"]
    assert hardware_warning(measured, xeon) is None
    assert hardware_warning(None, xeon) is None  # a server that does not say
    warning = hardware_warning("CPU: AMD EPYC, 2 cores", xeon)
    assert warning is not None and measured in warning and "AMD EPYC" in warning
