"""``engine serve``: parse options, start the children, serve HTTP, stop everything at exit."""

from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from types import FrameType

import msgspec
import uvicorn
import zmq

from core.router.options import router_config
from core.scheduler import SchedulerConfig
from core.scheduler.options import scheduler_config
from engine.ipc.config import ServeConfig
from engine.ipc.host_profile import profiled
from engine.launch.launcher import ChildDied, Launcher
from engine.launch.model_source import resolve_source
from engine.launch.options import build_parser, check_replicas, launch_options, make_config
from engine.launch.replicas import replica_configs
from engine.launch.rundir import make_run_dir, remove_run_dir
from engine.models.setup import ModelNotFoundError
from engine.server.listener import bind_listener
from engine.server.logs import configure_logging

log = logging.getLogger("engine.serve")

__all__ = ["build_parser", "make_config", "serve_main"]


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
    launch = launch_options(args)
    try:
        scheduler_config(args)  # a bad setting is an error before the model is looked for
        router_config(args)
        source = resolve_source(args.model, launch.tokenizer, bool(args.dummy_weights))
        cfg = make_config(args, source, Path())  # run_dir and port are filled in below
        check_replicas(cfg, launch.dp_share_gpu)
    except (ModelNotFoundError, ValueError) as exc:
        parser.exit(2, f"error: {exc}\n")
    configure_logging(cfg.log_level, "frontend")
    record = Path(cfg.record_steps) if cfg.record_steps else None
    if record is not None and (record.is_dir() or not record.parent.is_dir()):
        parser.exit(2, f"error: --record-steps {record}: not a file in an existing folder\n")
    try:
        listener = bind_listener(cfg.host, cfg.port)
    except OSError as exc:
        parser.exit(2, f"error: cannot listen on {cfg.host}:{cfg.port}: {exc}\n")

    for sig in SHUTDOWN_SIGNALS:
        signal.signal(sig, _on_signal)
    run_dir = make_run_dir()
    cfg = replace(cfg, run_dir=str(run_dir), port=int(listener.getsockname()[1]))
    log.info("run dir %s", run_dir)
    launcher = Launcher(replica_configs(cfg, launch.dp_share_gpu))
    ctx = zmq.Context()
    status = 0
    try:
        launcher.start()
        ready = launcher.wait_ready(ctx, launch.ready_timeout)
        # the core as rank 0 (of replica 0) sized it, and each replica's pools
        info = ready[cfg.child_name("scheduler", 0)].info
        sized = msgspec.convert(info["scheduler"], SchedulerConfig)
        cfg = replace(
            cfg,
            runner=replace(cfg.runner, scheduler=sized),
            hardware=info["hardware"],
            handoff_addr=info.get("handoff_addr", ""),  # a decode server's
            kv_addr=info.get("kv_addr", ""),
        )
        ranks = [ready[cfg.child_name("scheduler", 0, r)].info for r in range(cfg.dp_size)]
        pools = {r: (int(i["num_pages"]), int(i["host_pages"])) for r, i in enumerate(ranks)}
        with profiled(cfg.host_profile, "frontend"):
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
            # not captured for uvicorn to raise again at exit: the drain is this signal's
            # whole effect, and only a second one logs "SIGTERM received; shutting down"
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
