"""``engine serve --dp N``: replicas behind one frontend, placed by the router core.

Two CPU replicas serve concurrent requests with the greedy tokens of one
(``--dp 1``), each gets work (per-replica series in ``/metrics``);
``cache_aware`` keeps a repeated prefix on one replica; a replica whose
scheduler is killed fails only its own requests and leaves the rotation while
the other serves on, ``/health`` saying so; bad flags are clear errors.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
from conftest import (
    Server,
    descendants,
    greedy_ids,
    running_server,
    start_server,
    stop_server,
    wait_gone,
)

from engine.launch.replicas import check_placement
from engine.launch.serve import serve_main

pytestmark = pytest.mark.slow

PROMPTS = [
    "The quick brown fox",
    "In the beginning",
    "def fibonacci(n):",
    "Tea or coffee?",
    "Once upon a time",
    "The capital of France is",
]
SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def per_replica(server: Server, name: str) -> dict[str, float]:
    """The samples of metric ``name`` by their ``replica`` label."""
    out: dict[str, float] = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=10).text.splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) == name:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[labels["replica"]] = float(m.group(3))
    return out


@pytest.fixture(scope="module")
def dp2(model_ready: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    record = tmp_path_factory.mktemp("dp2") / "engine_steps.csv"
    with running_server("--dp", "2", "--num-pages", "256", "--record-steps", str(record)) as s:
        yield s


def test_dp2_serves_concurrent_requests_on_both_replicas_as_dp1_does(
    server: Server, dp2: Server
) -> None:
    card = httpx.get(f"{dp2.url}/v1/models", timeout=10).json()["data"][0]
    assert card["dp"] == 2 and card["router"]["policy"] == "round_robin"
    assert card["gpu_share"] == 1  # on CPU the replicas share cores, no GPU
    assert httpx.get(f"{dp2.url}/health", timeout=10).json() == {
        "status": "ok",
        "replicas": {"0": "healthy", "1": "healthy"},
    }
    together: dict[str, list[int]] = {}
    threads = [
        threading.Thread(target=lambda p=p: together.__setitem__(p, greedy_ids(dp2, p)))
        for p in PROMPTS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert together == {p: greedy_ids(server, p) for p in PROMPTS}
    finished = per_replica(dp2, "engine_replica_requests_finished_total")
    assert finished == {"0": 3, "1": 3}  # round_robin
    queried = per_replica(dp2, "engine_prefix_cache_queries_total")  # each scheduler's own
    assert queried.keys() == {"0", "1"} and min(queried.values()) > 0
    assert per_replica(dp2, "engine_replica_outstanding_requests") == {"0": 0, "1": 0}


def test_sim_validate_simulates_the_server_s_replicas_and_router(dp2: Server) -> None:
    import argparse

    from lab.bench.server import server_info
    from lab.validate.command import add_validate_args, sharing_warning, sim_config

    info = server_info(dp2.url)
    assert info.dp == 2 and info.router is not None and info.kv_pages_total == 256
    assert info.gpu_share == 1
    parser = argparse.ArgumentParser()
    add_validate_args(parser.add_subparsers())
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    argv = ["validate", "t.jsonl", "--url", dp2.url, "--profile", str(profile), "--out", "o"]
    config = sim_config(parser.parse_args(argv), info, 256)
    assert (config.replicas, config.router.policy) == (2, "round_robin")
    assert config.shared_frontend and config.colocation is None  # one frontend, own GPUs
    assert sharing_warning(info, config) is None
    shared = replace(info, gpu_share=2)  # as --dp-share-gpu reports it
    warning = sharing_warning(shared, sim_config(parser.parse_args(argv), shared, 256))
    assert warning is not None and "--colocation" in warning
    sticky = replace(info, router=info.router | {"policy": "session_sticky"})
    assert sim_config(parser.parse_args(argv), sticky, 256).router.policy == "session_sticky"
    # the tokenizer workers the card names, unless a flag says otherwise
    assert info.num_tokenizers == config.num_tokenizers == 1
    three = replace(info, num_tokenizers=3)
    assert sim_config(parser.parse_args(argv), three, 256).num_tokenizers == 3
    flag = parser.parse_args([*argv, "--num-tokenizers", "2"])
    assert sim_config(flag, three, 256).num_tokenizers == 2


def test_sim_validate_prices_each_replica_s_recorded_steps(dp2: Server, tmp_path: Path) -> None:
    """Each replica records its own steps; the run's table holds both, the attribution
    sets the cost model against each replica's plans."""
    from lab.cli.sim import main as sim_main
    from schema.steprecord import read_step_record, replica_record_path

    named = Path(httpx.get(f"{dp2.url}/v1/models", timeout=10).json()["data"][0]["record_steps"])
    trace = tmp_path / "t.jsonl"
    rows = [{"timestamp": 50 * i, "input_length": 48, "output_length": 4} for i in range(6)]
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    out = tmp_path / "o"
    argv = ["validate", str(trace), "--url", dp2.url, "--profile", str(profile), "--out",
            str(out), "--repeats", "1", "--no-report", "--no-progress"]  # fmt: skip
    assert sim_main(argv) == 0
    for k in range(2):
        assert len(read_step_record(replica_record_path(named, k, 2))) > 0
    steps = read_step_record(out / "real-1" / "engine_steps.csv")
    requests = json.loads((out / "real-1" / "summary.json").read_text())
    assert requests["completed"] == 6
    assert set(steps["replica"]) == {0, 1}  # round robin: three requests each
    assert steps["prefill_tokens"].sum() > 0
    assert steps.groupby("replica")["decode_requests"].sum().tolist() == [9, 9]
    placed = pd.read_csv(out / "real-1" / "requests.csv")["replica"]  # from the frontend
    assert placed.value_counts().to_dict() == {0: 3, 1: 3}
    comparison = json.loads((out / "comparison.json").read_text())
    assert comparison["placement"]["same_replica"] == [1.0]  # round robin places alike
    assert comparison["placement"]["replicas"]["1"]["real_runs"][0]["requests"] == 3
    attribution = json.loads((out / "attribution.json").read_text())
    replicas = attribution["runs"]["real-1"]["replicas"]
    assert {k: v["all"]["step"]["n"] for k, v in replicas.items()} == {
        str(k): int((steps["replica"] == k).sum()) for k in range(2)
    }


def test_cache_aware_keeps_a_repeated_prefix_on_one_replica(model_ready: str) -> None:
    prefix = "You are a careful assistant. Answer briefly and precisely. " * 4
    with running_server("--dp", "2", "--num-pages", "256", "--router", "cache_aware") as s:
        for question in ("What is 2+2?", "Name a colour.", "Say hi.", "Count to 3."):
            body = {"prompt": prefix + question, "max_tokens": 2, "temperature": 0}
            assert httpx.post(f"{s.url}/v1/completions", json=body, timeout=120).is_success
        routed = per_replica(s, "engine_replica_requests_routed_total")
        hits = per_replica(s, "engine_prefix_cache_hits_total")
        # the router forgets the prefix: with both trees empty a new prompt takes replica 0,
        # so the repeated prefix goes to the other replica than before, whichever that was
        home = max(routed, key=lambda r: routed[r])
        other = "1" if home == "0" else "0"
        flushed = httpx.post(f"{s.url}/flush_router", timeout=10)
        assert flushed.json() == {"flushed": True, "replicas": 2}
        again = [prefix + "Say bye."]
        if home == "0":
            again.insert(0, "An unrelated prompt. " * 8)
        for prompt in again:
            body = {"prompt": prompt, "max_tokens": 2, "temperature": 0}
            assert httpx.post(f"{s.url}/v1/completions", json=body, timeout=120).is_success
        after = per_replica(s, "engine_replica_requests_routed_total")
    assert routed == {home: 4, other: 0}
    assert hits[home] >= 3 * 32 and hits[other] == 0  # three repeats of a >2-page prefix
    assert after[other] == 1


class Stream(threading.Thread):
    """A streamed completion in its own thread: its data events and the text it got."""

    def __init__(self, url: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.url, self.max_tokens = url, max_tokens
        self.events: list[str] = []
        self.started = threading.Event()

    def run(self) -> None:
        body = {"prompt": "Tell me a long story.", "max_tokens": self.max_tokens}
        body |= {"ignore_eos": True, "stream": True}
        with (
            httpx.Client(base_url=self.url, timeout=120) as client,
            client.stream("POST", "/v1/completions", json=body) as resp,
        ):
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    self.events.append(line[6:])
                    self.started.set()

    def error(self) -> str | None:
        assert self.events[-1] == "[DONE]", self.events[-3:]
        last: dict[str, Any] = json.loads(self.events[-2])
        return str(last["error"]["message"]) if "error" in last else None


def child_of_replica(server: Server, role: str, rank: int, replica: int) -> int:
    for pid in descendants(server.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ours = argv[-4:-2] == [role.encode(), str(rank).encode()]
        if (
            b"engine.launch.child" in argv
            and ours
            and argv[-2].endswith(b"config%d.json" % replica)
        ):
            return pid
    raise AssertionError(f"no {role}{rank} of replica {replica}")


def test_kill_9_of_a_replica_fails_its_requests_and_the_other_serves_on(
    model_ready: str,
) -> None:
    server = start_server("--dp", "2", "--num-pages", "256")
    try:
        family = descendants(server.pid)
        streams = [Stream(server.url, 120) for _ in range(4)]  # round_robin: two on each
        for s in streams:
            s.start()
        for s in streams:
            assert s.started.wait(60)
        victim = child_of_replica(server, "scheduler", 0, 1)
        detokenizer = child_of_replica(server, "detokenizer", 0, 1)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        while httpx.get(f"{server.url}/health", timeout=2).json()["status"] == "ok":
            assert time.monotonic() - killed < 2.0, "/health still says ok"
            time.sleep(0.05)
        health = httpx.get(f"{server.url}/health", timeout=2)
        assert health.status_code == 200
        assert health.json()["status"] == "degraded"
        assert health.json()["replicas"] == {"0": "healthy", "1": "dead"}
        assert f"scheduler0.r1 (pid {victim}) exited with code -9" in health.json()["reason"]
        for s in streams:
            s.join(120)
            assert not s.is_alive(), "a stream hung"
        errors = sorted(str(s.error()) for s in streams)
        assert errors[:2] == ["None", "None"]  # replica 0's ran to their end
        for e in errors[2:]:
            assert e.startswith("replica 1 is down: scheduler0.r1"), e
        for _ in range(4):
            body = {"prompt": "Hello", "max_tokens": 4, "temperature": 0}
            assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=60).is_success
        routed = per_replica(server, "engine_replica_requests_routed_total")
        assert routed == {"0": 6, "1": 2}
        assert per_replica(server, "engine_replica_healthy") == {"0": 1, "1": 0}
        assert not wait_gone({detokenizer}, 10), "the dead replica's detokenizer lives on"
        assert "replica 1 is down" in server.log() and "Traceback" not in server.log()
        stop_server(server)
        assert server.proc.returncode == 0
        assert not wait_gone(family, 5), "processes left behind"
    finally:
        stop_server(server, check=False)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--dp", "0"], "must be >= 1"),
        (["--dp", "2", "--dp-share-gpu"], "--dp-share-gpu shares CUDA devices"),
        (["--device", "cuda", "--dp-share-gpu"], "--dp-share-gpu needs --dp 2 or more"),
        (["--router", "nope"], "invalid choice"),
        (["--router-load", "bytes"], "invalid choice: 'bytes'"),
    ],
)
def test_bad_dp_flags_are_clear_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main(["--model", "smollm2-135m", "--port", "0", *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_replicas_need_their_own_gpus_unless_they_share() -> None:
    with pytest.raises(ValueError, match=r"4 GPU\(s\) needed, 2 visible.*--dp-share-gpu"):
        check_placement("cuda", dp=2, tp=2, share_gpu=False, gpus=2)
    check_placement("cuda", dp=2, tp=2, share_gpu=True, gpus=2)
    with pytest.raises(ValueError, match=r"2 GPU\(s\) needed, 1 visible"):
        check_placement("cuda", dp=2, tp=2, share_gpu=True, gpus=1)
    with pytest.raises(ValueError, match="needs --dp 2 or more"):
        check_placement("cuda", dp=1, tp=1, share_gpu=True, gpus=1)
    check_placement("cpu", dp=4, tp=2, share_gpu=False, gpus=0)  # CPU replicas share the cores
