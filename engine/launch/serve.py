"""``engine serve``: parse options, start the children, serve HTTP, stop everything at exit."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import msgspec
import uvicorn
import zmq

from core.router import RouterConfig
from core.router.options import ROUTER_KEYS, add_router_flags, pop_router_config
from core.scheduler import SchedulerConfig
from core.scheduler.options import add_scheduler_flags, scheduler_config
from engine.ipc.config import MAX_REQUEST_BYTES, ServeConfig
from engine.launch.launcher import ChildDied, Launcher
from engine.launch.model_source import ModelSource, resolve_source
from engine.launch.replicas import check_placement, gpu_count, replica_configs
from engine.launch.rundir import make_run_dir, remove_run_dir
from engine.models.setup import ModelNotFoundError
from engine.server.listener import bind_listener
from engine.server.logs import configure_logging

log = logging.getLogger("engine.serve")
LOG_LEVELS = ("debug", "info", "warning", "error")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="engine serve", description="Serve a model over HTTP.")
    p.add_argument(
        "--model", required=True, help="known model name, HF folder, or (dummy weights) a preset"
    )
    p.add_argument(
        "--tokenizer",
        default=None,
        help="tokenizer: known model name or HF folder (default: the model's own; "
        "smollm2-135m for a preset)",
    )
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel degree")
    p.add_argument(
        "--dp",
        type=positive_int,
        default=1,
        help="data-parallel replicas behind this frontend, each its own scheduler and TP group "
        "(on CUDA its own --tp GPUs); --router picks one for every request",
    )
    p.add_argument(
        "--dp-share-gpu",
        action="store_true",
        help="put every replica on the same GPU(s), each with 1/dp of the memory the KV pool "
        "may use (CUDA)",
    )
    p.add_argument("--num-tokenizers", type=positive_int, default=1)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--dummy-weights", action="store_true", help="random weights, real shapes")
    p.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    p.add_argument(
        "--attention-backend",
        default="auto",
        choices=("auto", "torch", "flashinfer"),
        help="auto: flashinfer on CUDA when installed, torch otherwise",
    )
    p.add_argument(
        "--no-cuda-graph", action="store_true", help="run decode eagerly (CUDA; for debugging)"
    )
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="launch step N+1 before finishing step N (default: on for CUDA, off for CPU)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16", "float16"),
        help="auto: float32 on CPU, bfloat16 on CUDA",
    )
    p.add_argument("--max-model-len", type=positive_int, default=None)
    p.add_argument(
        "--max-queued",
        type=positive_int,
        default=None,
        help="requests that may wait for their first token; beyond it 429 with Retry-After "
        "(default: unbounded)",
    )
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=None,
        help="seconds a request may take before it is aborted with 504 (default: none)",
    )
    p.add_argument(
        "--max-request-bytes",
        type=positive_int,
        default=MAX_REQUEST_BYTES,
        help="largest request body; a larger one is refused with 413 before it is parsed "
        f"(default: {MAX_REQUEST_BYTES // 2**20} MiB)",
    )
    p.add_argument(
        "--drain-timeout",
        type=non_negative_float,
        default=20.0,
        help="on SIGTERM, seconds open requests may take to finish while new ones get 503 "
        "(0: stop at once)",
    )
    p.add_argument(
        "--gc-freeze",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="freeze each process's start-up heap out of the garbage collector's scans once it "
        "is ready, so that a full collection does not stall serving (default: on)",
    )
    p.add_argument(
        "--record-steps",
        type=Path,
        metavar="PATH",
        help="write every step scheduler rank 0 runs to PATH as CSV (the step record: "
        "schema/steprecord.py), in batches and at exit; with --dp N, replica K's to "
        "STEM.replicaK.SUFFIX beside PATH",
    )
    p.add_argument("--cpu-threads", type=positive_int, default=None, help="torch threads per rank")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ready-timeout", type=float, default=600.0)
    p.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    add_scheduler_flags(p)
    add_router_flags(p, "--dp N")
    return p


def router_config(args: argparse.Namespace) -> RouterConfig:
    """The router core's settings from ``--router`` and ``--router-*``; ``ValueError`` if bad."""
    given = {k: v for k, v in vars(args).items() if k in ROUTER_KEYS and v is not None}
    return pop_router_config(given)


def check_replicas(args: argparse.Namespace) -> None:
    """Raise ``ValueError`` when ``--dp`` replicas cannot be placed as asked."""
    gpus = gpu_count() if args.device == "cuda" else 0
    check_placement(args.device, args.dp, args.tp, args.dp_share_gpu, gpus)


def make_config(
    args: argparse.Namespace, source: ModelSource, run_dir: Path, port: int
) -> ServeConfig:
    """The config of this server, from its options and the model it resolved to."""
    context_len = source.context_len
    return ServeConfig(
        model=args.model,
        model_path=source.model_path,
        tokenizer_path=str(source.tokenizer_path),
        vocab_size=source.vocab_size,
        vocab_limit=source.vocab_limit,
        eos_token_ids=list(source.eos_token_ids),
        run_dir=str(run_dir),
        parent_pid=os.getpid(),
        max_model_len=min(args.max_model_len or context_len, context_len),
        scheduler=scheduler_config(args),
        device=args.device,
        dtype=args.dtype,
        tp_size=args.tp,
        dp_size=args.dp,
        router=router_config(args),
        num_tokenizers=args.num_tokenizers,
        host=args.host,
        port=port,
        dummy_weights=args.dummy_weights,
        api_key=args.api_key,
        max_queued=args.max_queued,
        request_timeout=args.request_timeout,
        drain_timeout=args.drain_timeout,
        max_request_bytes=args.max_request_bytes,
        attention_backend=args.attention_backend,
        cuda_graph=not args.no_cuda_graph,
        overlap=args.overlap,
        cpu_threads=args.cpu_threads,
        seed=args.seed,
        log_level=args.log_level,
        gc_freeze=args.gc_freeze,
        record_steps=str(args.record_steps.resolve()) if args.record_steps else None,
    )


SHUTDOWN_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class ShutdownRequested(Exception):
    """SIGINT, SIGTERM or SIGHUP arrived: stop everything and exit cleanly."""


def _on_signal(signum: int, frame: FrameType | None) -> None:
    raise ShutdownRequested(signal.Signals(signum).name)


def serve_main(argv: list[str] | None = None) -> int:
    """Run the server until SIGINT/SIGTERM, a shared child dies or no replica is left; returns
    the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, "frontend")
    try:
        scheduler_config(args)
        router_config(args)
        check_replicas(args)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    try:
        source = resolve_source(args.model, args.tokenizer, args.dummy_weights)
    except (ModelNotFoundError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    record = args.record_steps
    if record is not None and (record.is_dir() or not record.resolve().parent.is_dir()):
        parser.exit(2, f"error: --record-steps {record}: not a file in an existing folder\n")
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        parser.exit(2, f"error: cannot listen on {args.host}:{args.port}: {exc}\n")
    port = int(listener.getsockname()[1])

    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, _on_signal)
    run_dir = make_run_dir()
    cfg = make_config(args, source, run_dir, port)
    log.info("run dir %s", run_dir)
    launcher = Launcher(replica_configs(cfg, args.dp_share_gpu))
    ctx = zmq.Context()
    status = 0
    try:
        launcher.start()
        ready = launcher.wait_ready(ctx, args.ready_timeout)
        # the core's settings as rank 0 (of replica 0) runs them (the pool it sized included)
        info = ready[cfg.child_name("scheduler", 0)].info
        cfg.scheduler = msgspec.convert(info["scheduler"], SchedulerConfig)
        cfg.hardware = str(info.get("hardware", ""))
        ranks = [ready[cfg.child_name("scheduler", 0, r)].info for r in range(cfg.dp_size)]
        pools = {r: (int(i["num_pages"]), int(i["host_pages"])) for r, i in enumerate(ranks)}
        status = run_frontend(cfg, launcher, listener, pools)
    except ChildDied as exc:
        log.error("%s", exc)
        status = 1
    except TimeoutError as exc:
        log.error("%s", exc)
        status = 1
    except ShutdownRequested as exc:
        log.info("%s received; shutting down", exc)
    finally:
        for sig in SHUTDOWN_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        launcher.stop()
        listener.close()
        ctx.term()
        remove_run_dir(run_dir)
        log.info("stopped")
    return status


class EngineServer(uvicorn.Server):
    """uvicorn that drains on SIGTERM and fails open requests before closing their connections.

    The first SIGTERM (with a drain timeout) starts draining: ``on_drain`` makes
    new requests get 503, and the server stops once no request is open or the
    timeout has passed. SIGINT, a second SIGTERM, SIGHUP or a dead child stop it
    at once. At shutdown ``on_shutdown`` fails whatever is still open.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        drain_timeout: float,
        on_drain: Callable[[], None],
        open_requests: Callable[[], int],
        on_shutdown: Callable[[], None],
    ) -> None:
        super().__init__(config)
        self.drain_timeout = drain_timeout
        self.on_drain = on_drain
        self.open_requests = open_requests
        self.on_shutdown = on_shutdown
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_timeout > 0 and self.drain_deadline is None:
            self._captured_signals.append(sig)
            self.drain_deadline = time.monotonic() + self.drain_timeout
            log.info(
                "SIGTERM received; draining %d open requests for up to %g s",
                self.open_requests(),
                self.drain_timeout,
            )
            self.on_drain()
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        deadline = self.drain_deadline
        if deadline is not None and not self.should_exit:
            if self.open_requests() == 0:
                log.info("drained: no request is open")
                self.should_exit = True
            elif time.monotonic() >= deadline:
                log.warning("drain timeout: %d requests still open", self.open_requests())
                self.should_exit = True
        return await super().on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)


def run_frontend(
    cfg: ServeConfig,
    launcher: Launcher,
    listener: socket.socket,
    pools: dict[int, tuple[int, int]],
) -> int:
    """Serve HTTP in this process until told to stop; 1 if a child died. ``pools``: each
    replica's KV pages and host KV pages, as its scheduler reported them ready."""
    from engine.server.app import create_app
    from engine.server.logs import uvicorn_log_config

    app = create_app(cfg, health=lambda: launcher.dead, pools=pools)
    ctx = app.state.ctx
    config = uvicorn.Config(
        app,
        log_level=cfg.log_level,
        log_config=uvicorn_log_config(),
        timeout_graceful_shutdown=3,
        access_log=cfg.log_level == "debug",
    )

    def drain() -> None:
        ctx.draining = True

    def fail_open_requests() -> None:
        reason = launcher.dead or ("drain timeout" if ctx.draining else "shutdown")
        ctx.frontend.end_all(f"the server is shutting down: {reason}")

    server = EngineServer(
        config,
        drain_timeout=cfg.drain_timeout,
        on_drain=drain,
        open_requests=lambda: len(ctx.frontend.streams),
        on_shutdown=fail_open_requests,
    )
    launcher.watch(
        lambda _: setattr(server, "should_exit", True), ctx.frontend.replica_failed_threadsafe
    )

    def announce() -> None:
        while not server.started and not server.should_exit:
            time.sleep(0.05)
        if server.started:
            host = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
            print(f"engine serving {cfg.model} at http://{host}:{cfg.port}", flush=True)

    def on_hangup(signum: int, frame: FrameType | None) -> None:
        log.info("SIGHUP received; shutting down")
        server.should_exit = True

    signal.signal(signal.SIGHUP, on_hangup)  # uvicorn itself handles SIGINT and SIGTERM
    threading.Thread(target=announce, name="announce", daemon=True).start()
    server.run(sockets=[listener])
    if not server.started and launcher.dead is None:
        log.error("the HTTP server failed to start")
        return 1
    return 1 if launcher.dead else 0
