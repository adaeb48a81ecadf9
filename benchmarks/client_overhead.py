"""The HTTP side's own latency: ``engine bench`` against the real frontend fed by a stand-in engine.

    python benchmarks/client_overhead.py TRACE [--rate-scale X] [--limit N] \\
        [--step-ms 9] --out DIR

A child process runs the app of ``engine serve`` (``create_app``) under uvicorn, as
it serves, and beside it a stand-in for the tokenizer, scheduler and detokenizer
on the app's own ZeroMQ sockets: every ``--step-ms`` it sends one ``TextBatch``
with a one-token item for every request that is streaming (continuous batching,
prefill instant, each request to its trace's output length). ``engine bench``
then replays the trace against it. With no model, what a request's
``frontend_ms`` (client send -> the server's intake) and TTFT show beyond one
step is the HTTP side's: the server's event loop and the load generator's. The
child samples its event loop's lag (how late a 1 ms sleep wakes); the figures
tell the two apart. Writes ``DIR/bench/`` (``engine bench``'s outputs) and
``DIR/loop_lag.csv``, and prints both.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from engine.ipc import messages  # noqa: E402
from engine.ipc.config import ServeConfig  # noqa: E402
from engine.runner.args import RunnerArgs  # noqa: E402

TICK_S = 0.001
"""The lag sampler's sleep."""


def stand_in(cfg: ServeConfig, step_s: float, stop: threading.Event) -> None:
    """The engine behind the frontend: one batch a step, an item for every open request."""
    import zmq

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(cfg.tokenizer_addr(0))
    out = ctx.socket(zmq.PUSH)
    out.connect(cfg.frontend_addr)
    open_requests: dict[str, list[float]] = {}  # rid -> [tokens to go, sent, scheduled]
    next_step = time.time()
    try:
        while not stop.is_set():
            while inbox.poll(0):
                msg = messages.decode(inbox.recv())
                if isinstance(msg, messages.GenerateRequest):
                    open_requests[msg.rid] = [msg.sampling.max_new_tokens, 0, time.time()]
            now = time.time()
            if open_requests and now >= next_step:
                items = []
                for rid, state in list(open_requests.items()):
                    first, last = state[1] == 0, state[0] - state[1] == 1
                    items.append(messages.TextItem(
                        rid=rid, text=" a", token_ids=[int(state[1])], token_times=[now],
                        finish_reason="length" if last else None, prompt_tokens=int(first),
                        tokenized=state[2] if first else None,
                        first_scheduled=state[2] if first else None,
                        finished=now if last else None,
                    ))  # fmt: skip
                    state[1] += 1
                    if last:
                        del open_requests[rid]
                out.send(messages.encode(messages.TextBatch(items=items)))
                next_step = now + step_s
            time.sleep(step_s / 20)
    finally:
        inbox.close(linger=0)
        out.close(linger=0)
        ctx.term()


def serve(port: int, step_s: float, lag_csv: Path) -> None:
    """The child: the app under uvicorn beside the stand-in, its loop's lag sampled."""
    import uvicorn

    from engine.server.app import create_app

    lags: list[tuple[float, float]] = []
    stop_file = lag_csv.with_suffix(".stop")

    async def sample(server: uvicorn.Server) -> None:
        while not server.should_exit:  # the parent asks to stop with a file, not a signal
            start = time.perf_counter()
            await asyncio.sleep(TICK_S)
            lags.append((start, time.perf_counter() - start - TICK_S))
            server.should_exit = len(lags) % 100 == 0 and stop_file.exists()

    async def main(cfg: ServeConfig) -> None:
        config = uvicorn.Config(create_app(cfg, health=lambda: None), host="127.0.0.1",
                                port=port, log_level="warning")  # fmt: skip
        server = uvicorn.Server(config)
        sampler = asyncio.create_task(sample(server))
        await server.serve()
        await sampler

    with tempfile.TemporaryDirectory() as run_dir:
        cfg = ServeConfig(model="stand-in", runner=RunnerArgs(model="stand-in"), tokenizer_path="",
                          vocab_size=1 << 16, run_dir=run_dir, parent_pid=os.getpid(),
                          max_model_len=1 << 20)  # fmt: skip
        stop = threading.Event()
        engine = threading.Thread(target=stand_in, args=(cfg, step_s, stop), daemon=True)
        engine.start()
        try:
            asyncio.run(main(cfg))
        finally:
            stop.set()
            pd.DataFrame(lags, columns=["time", "lag_s"]).to_csv(lag_csv, index=False)


def wait_ready(child: subprocess.Popen[bytes], port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise RuntimeError(f"the stand-in server exited ({child.returncode})")
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the stand-in server did not start in {timeout:g} s")


def percentiles(values: pd.Series) -> str:
    p50, p90, p99 = (float(values.quantile(q)) for q in (0.5, 0.9, 0.99))
    return f"P50 {p50:7.1f}  P90 {p90:7.1f}  P99 {p99:7.1f}  max {float(values.max()):7.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("--rate-scale", type=float, default=1.0)
    p.add_argument("--limit", type=int)
    p.add_argument("--step-ms", type=float, default=9.0, help="the stand-in's step time")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--serve", nargs=3, help=argparse.SUPPRESS)  # the child: PORT STEP_S LAG_CSV
    args = p.parse_args(argv)
    if args.serve:
        serve(int(args.serve[0]), float(args.serve[1]), Path(args.serve[2]))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    lag_csv = args.out / "loop_lag.csv"
    server_args = ["--serve", str(port), str(args.step_ms / 1e3), str(lag_csv)]
    child = subprocess.Popen([sys.executable, __file__, args.trace, "--out", str(args.out),
                              *server_args])  # fmt: skip
    try:
        wait_ready(child, port)
        bench = [sys.executable, "-m", "lab.cli.engine", "bench", args.trace, "--url",
                 f"http://127.0.0.1:{port}", "--rate-scale", str(args.rate_scale),
                 "--out", str(args.out / "bench"), "--no-report", "--no-progress"]  # fmt: skip
        if args.limit:
            bench += ["--limit", str(args.limit)]
        done = subprocess.run(bench, cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            print(done.stdout + done.stderr, file=sys.stderr)
            return done.returncode
    finally:
        lag_csv.with_suffix(".stop").touch()
        try:
            child.wait(30)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        lag_csv.with_suffix(".stop").unlink()
    requests = pd.read_csv(args.out / "bench" / "requests.csv")
    lag = pd.read_csv(lag_csv)["lag_s"] * 1e3
    print(f"{len(requests)} requests, a step every {args.step_ms:g} ms (ms):")
    for column in ("frontend_ms", "send_lag_ms", "ttft_ms", "tpot_ms"):
        print(f"  {column:<12} {percentiles(requests[column])}")
    print(f"  server loop lag {percentiles(lag)}  ({np.mean(lag > 10):.2%} of samples > 10 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
