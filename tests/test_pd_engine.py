"""Prefill/decode disaggregation on CPU: ``engine serve --role prefill`` and ``--role decode``
behind ``engine router --prefill URL --decode URL``.

Greedy tokens through the pair equal a colocated server's (completions, chat and
``/generate``, streamed and not, a repeated prompt whose pages the decode server's prefix
cache holds, a request that ends with its first token); the cards report the roles; a
client that goes away frees the decode server's pages; a dead decode server fails its
request with an error (through the router, and straight to the prefill server after
``--pd-timeout``) and leaves the prefill server holding no page; bad flags are clear errors.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import MODEL, Server, descendants, start_server, stop_server
from test_engine_router import running_router

from engine.launch.serve import serve_main
from engine.router.main import router_main
from schema.steprecord import read_step_record

pytestmark = pytest.mark.slow

COMMON = ("--num-pages", "256", "--layout", "frontend")
PD = ("--pd-timeout", "3")
LONG_PROMPT = "Here is a list of the planets of the solar system, from the sun outwards: " * 3
PROMPTS = ["The capital of France is", "def fibonacci(n):", LONG_PROMPT, LONG_PROMPT]
GREEDY = {"model": MODEL, "max_tokens": 10, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Where the prefill and decode servers record their steps."""
    folder = tmp_path_factory.mktemp("pd_steps")
    return {role: folder / f"{role}.csv" for role in ("prefill", "decode")}


@pytest.fixture(scope="module")
def servers(model_ready: str, records: dict[str, Path]) -> Iterator[dict[str, Server]]:
    """A colocated server, a prefill server and a decode server, started side by side."""
    flags = {"colocated": COMMON, "prefill": (*COMMON, "--role", "prefill", *PD),
             "decode": (*COMMON, "--role", "decode", *PD)}  # fmt: skip
    for role, path in records.items():
        flags[role] = (*flags[role], "--record-steps", str(path))
    with ThreadPoolExecutor(3) as pool:
        futures = {role: pool.submit(start_server, *args) for role, args in flags.items()}
        started = {role: f.result() for role, f in futures.items() if f.exception() is None}
    try:
        assert len(started) == 3, "a server did not start"
        yield started
    finally:
        for server in started.values():
            stop_server(server)


@pytest.fixture(scope="module")
def router(servers: dict[str, Server]) -> Iterator[str]:
    args = ("--prefill", servers["prefill"].url, "--decode", servers["decode"].url)
    with running_router(*args) as (_, url):
        yield url


def metric(server: Server, name: str) -> float:
    """The value of the unlabelled-by-status series ``name`` (0 when it has none yet)."""
    return server.metrics().get(name, 0.0)


def answer(url: str, path: str, body: dict[str, Any]) -> tuple[str, list[int]]:
    """The text (and, from ``/generate``, the token ids) of a request, streamed or not."""
    if not body.get("stream"):
        r = httpx.post(f"{url}{path}", json=body, timeout=60)
        assert r.status_code == 200, r.text
        data = r.json()
        if path == "/generate":
            return data["text"], data["output_ids"]
        choice = data["choices"][0]
        return choice.get("text") or choice["message"]["content"], []
    text, ids = "", []
    with httpx.stream("POST", f"{url}{path}", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line.removeprefix("data: "))
            assert "error" not in event, event
            if path == "/generate":
                text, ids = text + event["text"], ids + event["output_ids"]
            else:
                for choice in event["choices"]:
                    text += choice.get("text") or choice.get("delta", {}).get("content") or ""
    return text, ids


def cases() -> Iterator[tuple[str, dict[str, Any]]]:
    for prompt in PROMPTS:
        yield "/v1/completions", {**GREEDY, "prompt": prompt}
    chat = [{"role": "user", "content": "Name three colours."}]
    yield "/v1/chat/completions", {**GREEDY, "messages": chat}
    yield "/generate", {"text": PROMPTS[0], "sampling_params": {"max_new_tokens": 8,
                        "temperature": 0, "ignore_eos": True}}  # fmt: skip
    yield "/v1/completions", {**GREEDY, "prompt": PROMPTS[1], "max_tokens": 1}


def test_cards_report_their_roles(servers: dict[str, Server], router: str) -> None:
    cards = {
        role: httpx.get(f"{s.url}/v1/models", timeout=10).json()["data"][0]
        for role, s in servers.items()
    }
    for role, card in cards.items():
        assert card["role"] == card["scheduler"]["role"] == role
    assert cards["decode"]["handoff_address"].startswith("tcp://127.0.0.1:")
    assert cards["decode"]["kv_address"].startswith("tcp://127.0.0.1:")
    assert cards["prefill"]["handoff_address"] is None
    cluster = httpx.get(f"{router}/v1/models", timeout=10).json()["data"][0]
    assert cluster["role"] == "disaggregated"
    assert cluster["workers"] == [servers["decode"].url]
    assert cluster["prefill_workers"] == [servers["prefill"].url]


def test_sim_validate_reads_the_pair_behind_the_router(router: str) -> None:
    """``sim validate --url`` of a prefill/decode router simulates one prefill and one decode
    replica, the scheduler's other settings the decode server's (its role left out)."""
    import argparse

    from lab.bench.server import server_info
    from lab.validate.command import add_validate_args, sim_config

    info = server_info(router)
    assert (info.dp, info.prefill_workers, info.kv_pages_total) == (1, 1, 256)
    parser = argparse.ArgumentParser()
    add_validate_args(parser.add_subparsers())
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    argv = ["validate", "t.jsonl", "--url", router, "--profile", str(profile), "--out", "o"]
    config = sim_config(parser.parse_args(argv), info, 256)
    assert (config.prefill_replicas, config.decode_replicas, config.replicas) == (1, 1, 1)
    assert config.scheduler.role == "colocated" and config.disaggregated
    assert config.layout == "frontend" and config.scheduler_config().num_pages == 256


def test_greedy_output_through_the_pair_is_the_colocated_servers(
    servers: dict[str, Server], router: str
) -> None:
    for path, body in cases():
        expected = answer(servers["colocated"].url, path, body)
        for stream in (False, True):
            got = answer(router, path, {**body, "stream": stream})
            assert got == expected, (path, body, stream)
    prefill, decode = servers["prefill"], servers["decode"]
    assert metric(decode, "engine_prefix_cache_hits_total") > 0  # the repeated long prompt
    for server in (prefill, decode):
        assert metric(server, "engine_kv_transfer_bytes_total") > 0
        assert metric(server, "engine_kv_transfer_seconds_total") > 0
        assert metric(server, "engine_kv_pages_held") == 0
        assert metric(server, "engine_kv_pages_in_transfer") == 0
    sent = prefill.metrics()["engine_kv_transfer_bytes_total"]
    assert sent == decode.metrics()["engine_kv_transfer_bytes_total"]


def test_the_step_records_carry_the_transfers(
    servers: dict[str, Server], router: str, records: dict[str, Path]
) -> None:
    """Each server's step record counts the transfers that ended between its steps: a
    request's KV lands before its first decode step, so the decode server's rows hold all it
    took in; the prefill server's, those acknowledged before its last step."""
    for path, body in cases():
        answer(router, path, body)
    for role in ("prefill", "decode"):
        server = servers[role]
        total = metric(server, "engine_kv_transfer_bytes_total")
        transfers = ok_transfers(server)
        deadline = time.monotonic() + 10  # the loop flushes its record once it falls idle
        while True:
            steps = read_step_record(records[role])
            if steps["kv_bytes"].sum() == total or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert steps["kv_bytes"].sum() > 0 and steps["kv_transfer_ms"].sum() > 0
        if role == "decode":
            assert steps["kv_bytes"].sum() == total
            assert steps["kv_transfers"].sum() == transfers
        else:
            assert steps["kv_bytes"].sum() <= total
            assert steps["kv_transfers"].sum() <= transfers


def ok_transfers(server: Server) -> float:
    """The transfers that ended ok (``engine_kv_transfers_total{status="ok"}``)."""
    text = httpx.get(f"{server.url}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("engine_kv_transfers_total{") and 'status="ok"' in line
    )


def test_a_client_that_goes_away_frees_the_decode_servers_pages(
    servers: dict[str, Server], router: str
) -> None:
    decode = servers["decode"]
    body = {**GREEDY, "prompt": "Tell me a story.", "max_tokens": 300, "stream": True}
    aborted = metric(decode, "engine_requests_aborted_total")
    with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        wait_until(lambda: metric(decode, "engine_kv_pages_held") > 0)
    wait_until(lambda: metric(decode, "engine_requests_aborted_total") == aborted + 1)
    for server in (decode, servers["prefill"]):
        wait_until(lambda s=server: metric(s, "engine_kv_pages_held") == 0)  # type: ignore[misc]
        assert metric(server, "engine_pd_open_handoffs") == 0


def test_an_abort_storm_leaves_no_page_held_on_either_side(
    servers: dict[str, Server], router: str
) -> None:
    """24 streamed requests at once through the pair, each client closing at a random
    point (before its answer, after some chunks) or reading to the end: afterwards neither
    server holds a page or an open hand-off, and the requests read to the end completed
    with every token."""
    rng = random.Random(7)
    plans = [rng.choice([-1, 0, 1, 3, 6]) for _ in range(24)]  # chunks read; -1: all

    def client(k: int, chunks: int) -> str:
        body = {**GREEDY, "prompt": f"{LONG_PROMPT} Fact {k}:", "max_tokens": 12, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=60) as r:
            if chunks == 0:
                return "closed"
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == chunks:
                        return "closed"
            assert events[-1] == "data: [DONE]", events[-3:]
            return f"done {json.loads(events[-2][6:])['usage']['completion_tokens']}"

    with ThreadPoolExecutor(24) as pool:
        outcomes = list(pool.map(client, range(len(plans)), plans))
    assert set(outcomes) <= {"closed", "done 12"}, outcomes
    assert "done 12" in outcomes and "closed" in outcomes
    for server in (servers["prefill"], servers["decode"]):
        wait_until(lambda s=server: metric(s, "engine_kv_pages_held") == 0, 60)  # type: ignore[misc]
        assert metric(server, "engine_pd_open_handoffs") == 0
        assert metric(server, "engine_kv_pages_in_transfer") == 0
        assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    assert answer(router, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]}) == answer(
        servers["colocated"].url, "/v1/completions", {**GREEDY, "prompt": PROMPTS[0]}
    )


def test_a_router_refuses_a_worker_of_the_wrong_role(servers: dict[str, Server]) -> None:
    args = ("--prefill", servers["prefill"].url, "--decode", servers["colocated"].url)
    with running_router(*args) as (_, url):
        r = httpx.post(f"{url}/v1/completions", json={**GREEDY, "prompt": "Hi"}, timeout=30)
    assert r.status_code == 503
    assert "is not a decode server (its role: colocated)" in r.json()["error"]["message"]
    assert metric(servers["prefill"], "engine_kv_pages_held") == 0


def test_a_server_refuses_a_request_meant_for_another_role(servers: dict[str, Server]) -> None:
    """``pd`` only to a prefill or decode server; those take nothing else, nor log-probs."""
    room = {"room": "r1"}
    cases = [
        ("colocated", {"pd": room}, "pd", "this one is colocated"),
        ("decode", {}, "pd", "it serves only requests of a prefill/decode pair"),
        ("prefill", {"pd": room}, "pd.decode", "needs the decode server's address"),
        ("decode", {"pd": room, "logprobs": 1}, "logprobs", "not served with prefill/decode"),
    ]
    for role, extra, param, message in cases:
        body = {**GREEDY, "prompt": "Hi", **extra}
        r = httpx.post(f"{servers[role].url}/v1/completions", json=body, timeout=30)
        assert r.status_code == 400, (role, r.text)
        err = r.json()["error"]
        assert err["param"] == param and message in err["message"], (role, err)
    assert metric(servers["decode"], "engine_pd_open_handoffs") == 0


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--role", "decode", "--speculative", "ngram"], "--role decode with --speculative"),
        (["--role", "prefill", "--tp", "2"], "--role prefill needs --tp 1"),
        (["--role", "decode", "--dp", "2"], "--role decode needs --dp 1"),
        (["--role", "both"], "invalid choice: 'both'"),
    ],
)
def test_bad_role_flags_are_clear_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        serve_main(["--model", MODEL, "--port", "0", *flags])
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--prefill", "http://a"], "at least one --prefill and one --decode"),
        (["--worker", "http://a", "--decode", "http://b"], "not both"),
        (["--prefill", "http://a", "--decode", "http://a"], "a worker is given twice"),
    ],
)
def test_bad_router_flags_are_clear_errors(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        router_main(flags)
    assert exit_.value.code == 2
    assert message in capsys.readouterr().err


def test_a_dead_decode_server_fails_its_requests_and_frees_the_prefill_servers_pages(
    servers: dict[str, Server], router: str
) -> None:
    """Killed (kill -9, its whole tree) while the prefill server computes a long prompt: the
    client's request fails with an error; then a request straight to the prefill server that
    names the dead decode server fails after ``--pd-timeout`` (3 s). Neither leaves a page
    held on the prefill server."""
    prefill, decode = servers["prefill"], servers["decode"]
    handoff = httpx.get(f"{decode.url}/v1/models", timeout=10).json()["data"][0]["handoff_address"]
    body = {**GREEDY, "prompt": "the planets of the solar system " * 300, "stream": True}
    outcome: list[str] = []

    def client() -> None:
        with httpx.stream("POST", f"{router}/v1/completions", json=body, timeout=60) as r:
            outcome.append(f"{r.status_code} {r.read().decode()}")

    thread = threading.Thread(target=client)
    thread.start()
    wait_until(lambda: metric(decode, "engine_pd_open_handoffs") == 1)  # it waits for its KV
    for pid in [decode.pid, *descendants(decode.pid)]:
        os.kill(pid, signal.SIGKILL)
    thread.join(30)
    assert outcome, "the request hung after its decode server died"
    assert outcome[0].startswith("502") or '"error"' in outcome[0], outcome[0]
    wait_until(lambda: metric(prefill, "engine_kv_pages_held") == 0)

    direct = {**GREEDY, "prompt": "Hello there", "pd": {"room": "lost", "decode": handoff}}
    started = time.monotonic()
    r = httpx.post(f"{prefill.url}/v1/completions", json=direct, timeout=30)
    assert r.status_code == 503, r.text
    assert "did not answer the hand-off within 3 s" in r.json()["error"]["message"]
    assert 2.5 < time.monotonic() - started < 15
    assert metric(prefill, "engine_kv_pages_held") == 0
    assert metric(prefill, "engine_kv_pages_in_transfer") == 0


def wait_until(ok: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)
