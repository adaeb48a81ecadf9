"""``sim validate --capacity``: the search, the edge and its interval, and a planted capacity
found on a fake server over real HTTP."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import statistics
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from lab.cli.sim import main
from lab.validate.capacity import crossing, edge, search_real

ROOT = Path(__file__).resolve().parents[1]
SERVICE_S = 0.08  # the fake engine serves one request at a time, 80 ms each
INTERVAL_S = 0.2  # the trace's requests arrive every 200 ms: capacity = 0.2 / 0.08 = 2.5x
PLANTED = INTERVAL_S / SERVICE_S


def test_the_search_finds_a_sharp_edge_within_its_tolerance() -> None:
    calls: list[float] = []

    def run(x: float) -> float:
        calls.append(x)
        return 1.0 if x <= 3.3 else 0.2

    out = search_real(run, attainment=0.99, tolerance=0.05, repeats=2)
    assert out["capacity"] <= 3.3 < out["first_failing"] <= out["capacity"] * 1.05
    assert calls[:3] == [1.0, 2.0, 4.0]  # sim capacity's bracket: double from 1
    edge_runs = {p["rate_scale"]: p["attainment"] for p in out["probes"]}
    assert len(edge_runs[out["capacity"]]) == 2 and len(edge_runs[out["first_failing"]]) == 2


def test_noise_near_the_edge_widens_the_interval() -> None:
    rng = random.Random(3)

    def run(x: float) -> float:  # between 2.2x and 2.8x a run passes or fails at random
        return 1.0 if x < 2.2 else 0.0 if x > 2.8 else rng.choice([1.0, 0.0])

    out = search_real(run, attainment=0.99, tolerance=0.02, repeats=3)
    assert 1.1 <= out["capacity"] <= 2.8 and 2.2 <= out["first_failing"] <= 5.6
    assert edge({1.0: [1.0], 2.0: [1.0, 0.5], 2.5: [1.0, 1.0], 3.0: [0.5]}, 0.99) == (2.5, 3.0)
    assert edge({1.0: [1.0], 2.0: [1.0, 0.5], 2.5: [0.5, 0.5], 3.0: [1.0]}, 0.99) == (1.0, 2.5)
    assert edge({1.0: [0.5]}, 0.99) == (0.0, 1.0) and edge({1.0: [1.0]}, 0.99) == (1.0, None)


def test_a_repeat_failing_at_lo_bisects_again_inside_the_interval() -> None:
    """The H200 case: 4x passed once (99.6 %) and failed its repeat (98.8 %), so the edge
    interval fell back to the last all-pass scale, 2x: the search goes on between 2x and 4x."""
    seen: dict[float, int] = {}

    def run(x: float) -> float:
        seen[x] = seen.get(x, 0) + 1
        if abs(x - 4.0) < 1e-9:
            return 0.996 if seen[x] == 1 else 0.988
        return 1.0 if x < 3.9 else 0.9

    out = search_real(run, attainment=0.99, tolerance=0.15, repeats=2)
    assert 2.0 < out["capacity"] < 3.9 < 4.0 < out["first_failing"]
    runs = {p["rate_scale"]: p["attainment"] for p in out["probes"]}
    assert 4.0 / out["capacity"] <= 1.15 and len(runs[out["capacity"]]) == 2
    assert out["crossing"] is not None and 4.0 < out["crossing"] < out["first_failing"]


def test_crossing_interpolates_the_mean_attainment_in_log_scale() -> None:
    mean = {1.0: 1.0, 2.0: 1.0, 4.0: 0.992, 4.362: 0.968, 8.0: 0.44}
    x = crossing(mean, 0.99)
    assert x is not None and 4.0 < x < 4.1
    assert crossing({1.0: 0.5}, 0.99) is None
    assert crossing({1.0: 1.0, 2.0: 1.0}, 0.99) == 2.0
    assert crossing({1.0: 1.0, 2.0: 0.0}, 0.5) == pytest.approx(2**0.5)


def fake_app(holds: list[float]) -> Starlette:
    """An OpenAI-style server with one engine that serves requests one at a time, first come
    first served, in ``SERVICE_S`` each; tokens then stream at once. ``holds``: how long each
    request held the engine (the sleep's overshoot on a busy machine included)."""
    engine = asyncio.Lock()

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"data": [{"id": "fake", "owned_by": "fake"}]})

    async def completions(request: Request) -> StreamingResponse:
        body = await request.json()
        await engine.acquire()
        start = time.perf_counter()

        async def stream() -> AsyncIterator[str]:
            try:
                await asyncio.sleep(SERVICE_S)
            finally:
                holds.append(time.perf_counter() - start)
                engine.release()
            for _ in range(body["max_tokens"]):
                yield "data: " + json.dumps({"choices": [{"index": 0, "text": " a"}]}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream")

    routes = [Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])]
    return Starlette(routes=routes)


@pytest.fixture
def holds() -> list[float]:
    return []


@pytest.fixture
def fake_url(holds: list[float]) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(fake_app(holds), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


@pytest.mark.slow
def test_the_planted_capacity_of_a_fake_server(
    fake_url: str,
    holds: list[float],
    model_ready: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    trace = tmp_path / "even.jsonl"
    rows = [{"timestamp": 1e3 * INTERVAL_S * i, "input_length": 16, "output_length": 2}
            for i in range(40)]  # fmt: skip
    trace.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "capacity"
    argv = ["validate", str(trace), "--url", fake_url, "--capacity", "--slo-ttft-ms", "200",
            "--slo-tpot-ms", "1000", "--attainment", "0.9", "--tolerance", "0.1",
            "--profile", str(ROOT / "profiles" / "h200_llama-3.1-8b.csv"), "--num-pages", "4096",
            "--model", "llama-3.1-8b", "--tokenizer", model_ready, "--out", str(out),
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    answer = json.loads((out / "capacity.json").read_text())
    real = answer["real"]
    # the capacity the fake engine offered: PLANTED on an idle machine, less where its
    # sleeps overshoot (this test's client shares its process)
    planted = INTERVAL_S / statistics.median(holds)
    assert planted <= PLANTED * 1.01
    # 36 of 40 requests within 200 ms hold up to about 2.6x; the bracket is within 10 %
    assert planted / 1.12 <= real["capacity"] <= planted * 1.1, (real, planted)
    assert real["capacity"] < real["first_failing"] <= planted * 1.25
    assert answer["trace_rate"] == pytest.approx(1 / INTERVAL_S, rel=0.03)
    assert answer["sim"]["capacity"] > 0 and answer["sim"]["error"] == ""
    assert answer["rel_err"] == pytest.approx(answer["sim"]["capacity"] / real["capacity"] - 1)
    assert "--capacity" in answer["run"]["command"]
    assert (out / f"real-x{real['capacity']:.4g}-2" / "summary.json").is_file()
    printed = capsys.readouterr().out
    assert "  real       " in printed and "  error      " in printed
