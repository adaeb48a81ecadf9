"""``engine router`` in front of two real CPU servers: routes, drains, survives a worker dying.

A killed worker's open stream ends with an ``error`` event and a hung one's
is failed by the health check (not a hang); the next requests go to the
worker that is left, and the router's ``/health`` and ``/metrics`` say so.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from conftest import MODEL, Server, running_server, wait_gone, watch_url

pytestmark = pytest.mark.slow

SHORT = {"model": MODEL, "prompt": "The capital of France is", "max_tokens": 3}
LONG = {"model": MODEL, "prompt": "Tell me a story.", "max_tokens": 400, "ignore_eos": True}
FAST_CHECKS = ("--health-interval", "0.2", "--health-timeout", "0.5", "--health-failures", "2")


@contextmanager
def running_router(*args: str) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """``engine router`` (through ``router_main``) on a free port; SIGTERM and reap at exit."""
    cmd = [sys.executable, "-m", "engine.router.main", "--port", "0", *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    url = watch_url(proc)
    deadline = time.monotonic() + 30
    while not url and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert url, f"engine router did not start (exit status {proc.poll()})"
        yield proc, url[0]
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def by_worker(url: str, metric: str) -> dict[str, float]:
    """The router's ``metric`` by worker URL."""
    out = {}
    for line in httpx.get(f"{url}/metrics", timeout=10).text.splitlines():
        if line.startswith(metric + "{"):
            out[line.split('"')[1]] = float(line.rsplit(" ", 1)[1])
    return out


def routed(url: str) -> dict[str, float]:
    return by_worker(url, "router_requests_routed_total")


def outstanding(url: str) -> dict[str, float]:
    return by_worker(url, "router_outstanding_requests")


@pytest.fixture(scope="module")
def workers(model_ready: str) -> Iterator[list[Server]]:
    with running_server("--num-pages", "256") as a, running_server("--num-pages", "256") as b:
        yield [a, b]


def test_routes_round_robin_streams_and_answers_bad_input(workers: list[Server]) -> None:
    urls = [w.url for w in workers]
    with running_router("--worker", urls[0], "--worker", urls[1], "--policy", "round_robin") as (
        _,
        url,
    ):
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        assert httpx.get(f"{url}/v1/models").json()["data"][0]["id"] == MODEL
        for _ in range(2):
            r = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=60)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as r:  # fmt: skip
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]" and len(events) >= 3
        assert routed(url) == {urls[0]: 2.0, urls[1]: 1.0}
        # forgotten: round robin starts again from the first worker
        assert httpx.post(f"{url}/flush_router").json() == {"flushed": True, "workers": 2}
        assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=60).status_code == 200
        assert routed(url) == {urls[0]: 3.0, urls[1]: 1.0}
        bad = httpx.post(f"{url}/v1/completions", content=b"{nope", timeout=10)
        assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
        assert httpx.post(f"{url}/v1/completions", json=[1], timeout=10).status_code == 400
        unknown_model = httpx.post(f"{url}/v1/completions", json={**SHORT, "model": "x"})
        assert unknown_model.status_code == 404  # the worker's own error, passed on
        assert httpx.get(f"{url}/nowhere").status_code == 404
        assert outstanding(url) == {urls[0]: 0.0, urls[1]: 0.0}


def test_sim_validate_through_the_router_simulates_its_workers(workers: list[Server]) -> None:
    """The router's model card says what serves behind it: ``sim validate --url ROUTER``
    simulates as many replicas behind the same policy, each its own server (frontend
    included), with the pages the workers report."""
    import argparse

    from lab.bench.server import server_info
    from lab.validate.command import add_validate_args, sim_config

    urls = [w.url for w in workers]
    args = ("--worker", urls[0], "--worker", urls[1], "--policy", "cache_aware")
    with running_router(*args, "--cache-threshold", "0.3") as (_, url):
        info = server_info(url)
        card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    assert card["workers"] == urls and card["record_steps"] is None
    assert (info.dp, info.shared_frontend, info.kv_pages_total) == (2, False, 256)
    parser = argparse.ArgumentParser()
    add_validate_args(parser.add_subparsers())
    profile = Path(__file__).resolve().parents[1] / "profiles" / "cpu-xeon-2core_smollm2-135m.csv"
    argv = ["validate", "t.jsonl", "--url", url, "--profile", str(profile), "--out", "o"]
    config = sim_config(parser.parse_args(argv), info, 256)
    assert (config.replicas, config.router.policy, config.shared_frontend) == (
        2,
        "cache_aware",
        False,
    )
    assert config.router.cache_threshold == 0.3


def test_sigterm_drains_open_streams_and_refuses_new_requests(workers: list[Server]) -> None:
    urls = [w.url for w in workers]
    args = ("--worker", urls[0], "--worker", urls[1], "--drain-timeout", "30")
    with running_router(*args) as (proc, url):
        body = {**LONG, "max_tokens": 40, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.2)
            refused = httpx.post(f"{url}/v1/completions", json=SHORT, timeout=10)
            assert refused.status_code == 503 and refused.headers["retry-after"]
            assert httpx.get(f"{url}/health").json()["status"] == "draining"
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert proc.wait(15) == 0


def test_a_hung_then_a_killed_worker_fail_their_requests_and_the_other_serves(
    workers: list[Server],
) -> None:
    """SIGSTOP: the health check fails the open stream, and SIGCONT brings the worker back;
    kill -9: the stream breaks off with an error event; the other worker serves the rest."""
    urls = [w.url for w in workers]
    pids = {w.url: w.pid for w in workers}
    args = ("--worker", urls[0], "--worker", urls[1], "--policy", "least_outstanding")
    with running_router(*args, *FAST_CHECKS) as (_, url):
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            victim, last = stream_until(url, lambda worker, sig=sig: os.kill(pids[worker], sig))
            error = json.loads(last.removeprefix("data: "))["error"]
            assert error["code"] == "worker_failed" and victim in error["message"]
            if sig == signal.SIGSTOP:
                os.kill(pids[victim], signal.SIGCONT)
                wait_for(url, victim, "healthy")
        wait_for(url, victim, "dead")
        before = routed(url)
        for _ in range(3):
            assert httpx.post(f"{url}/v1/completions", json=SHORT, timeout=60).status_code == 200
        assert routed(url)[victim] == before[victim]
        assert sum(outstanding(url).values()) == 0
    victim_server = next(w for w in workers if w.url == victim)
    assert not wait_gone({victim_server.pid}, 15)


def wait_for(url: str, worker: str, state: str) -> None:
    deadline = time.monotonic() + 10
    while httpx.get(f"{url}/health").json()["workers"][worker] != state:
        assert time.monotonic() < deadline, f"{worker} did not become {state}"
        time.sleep(0.05)


def stream_until(url: str, hurt: Callable[[str], None]) -> tuple[str, str]:
    """Open a long stream, ``hurt`` its worker after the first event; the worker and last event."""
    body = {**LONG, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        victim = next(w for w, n in outstanding(url).items() if n == 1)
        hurt(victim)
        start = time.monotonic()
        last = [line for line in lines if line.startswith("data: ")][-1]
        assert time.monotonic() - start < 10, "the stream hung after its worker failed"
    return victim, last


def test_route_request_reads_prompt_size_and_session() -> None:
    from core.router.prompt_key import TEXT_CHUNK
    from engine.router.keys import body_route

    chat = {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * 40}]}],
            "max_completion_tokens": 7, "user": "u1"}  # fmt: skip
    req = body_route("r1", chat)
    assert req.session == "u1" and req.output_tokens == 7 and req.input_tokens > 0
    assert all(len(str(k)) <= TEXT_CHUNK for k in req.key) and len(req.key) == 3
    ids = body_route("r2", {"prompt": [1, 2, 3], "prompt_cache_key": "c", "max_tokens": 2})
    assert ids.key == (1, 2, 3) and ids.input_tokens == 3 and ids.session == "c"
    odd = body_route("r3", {"prompt": {"not": "a prompt"}, "max_tokens": "many"})
    assert odd.key == () and odd.output_tokens == 0
