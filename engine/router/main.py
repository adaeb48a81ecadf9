"""``engine router --worker URL [--worker URL ...] --router P``: route requests over workers.

The router's settings are the ``--router-*`` flags ``engine serve --dp`` and ``sim replay``
take (``core.router.options``); each also answers to its field's name (``--policy``, ``--load``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Callable

from aiohttp import web

from core.router.options import add_router_flags, router_config
from engine.router.app import create_app
from engine.router.service import HealthCheck, RouterService
from engine.server.listener import bind_listener
from engine.server.logs import configure_logging

log = logging.getLogger("engine.router")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="engine router", description="Route requests over OpenAI-compatible servers."
    )
    p.add_argument(
        "--worker",
        action="append",
        required=True,
        metavar="URL",
        help="a worker's base URL, e.g. http://127.0.0.1:8001 (repeat for each)",
    )
    add_router_flags(p, "", bare=True)
    check = HealthCheck()
    p.add_argument("--health-interval", type=float, default=check.interval_s, metavar="S")
    p.add_argument("--health-timeout", type=float, default=check.timeout_s, metavar="S")
    p.add_argument(
        "--health-failures",
        type=int,
        default=check.failures,
        metavar="N",
        help="missed health checks in a row that mark a worker dead",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=20.0,
        metavar="S",
        help="on SIGTERM, seconds open requests may take while new ones get 503",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def worker_url(text: str) -> str:
    url = text.rstrip("/")
    if not url.startswith(("http://", "https://")) or url[-3:] == "://":
        raise ValueError(f"a worker must be an http(s) URL, got {text!r}")
    return url


async def serve(
    service: RouterService, listener: socket.socket, drain_timeout: float, ready: Callable[[], None]
) -> None:
    """Serve on ``listener`` until a signal: SIGTERM or SIGINT refuses new requests (503),
    waits for the open ones up to ``drain_timeout``, then stops; a second signal stops at once.
    Whatever is still open then fails with an error."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if service.draining:
            stop.set()
            return
        service.draining = True
        drainer = loop.create_task(drain(service, drain_timeout))
        drainer.add_done_callback(lambda _: stop.set())

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await service.start()
    await service.probe_all()
    checker = loop.create_task(service.health_loop())
    runner = web.AppRunner(
        create_app(service), handler_cancellation=True, access_log=None, shutdown_timeout=2
    )
    await runner.setup()
    await web.SockSite(runner, listener).start()
    ready()
    try:
        await stop.wait()
    finally:
        checker.cancel()
        await service.close()
        await runner.cleanup()


async def drain(service: RouterService, timeout: float) -> None:
    log.info("draining: %d open requests, up to %.1f s", service.core.outstanding, timeout)
    deadline = service.now() + timeout
    while service.core.outstanding and service.now() < deadline:
        await asyncio.sleep(0.05)


def router_main(argv: list[str]) -> int:
    """Run the router until SIGTERM/SIGINT; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, "router")
    try:
        workers = [worker_url(w) for w in args.worker]
        if len(set(workers)) != len(workers):
            raise ValueError("a worker is given twice")
        config = router_config(args)
        check = HealthCheck(args.health_interval, args.health_timeout, args.health_failures)
        if check.interval_s <= 0 or check.timeout_s <= 0 or check.failures < 1:
            raise ValueError("health interval and timeout must be > 0, failures >= 1")
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")
    try:
        listener = bind_listener(args.host, args.port)
    except OSError as exc:
        parser.exit(2, f"error: cannot listen on {args.host}:{args.port}: {exc}\n")
    host, port = listener.getsockname()[:2]
    service = RouterService(workers, config, check)

    def ready() -> None:
        print(f"engine router ({config.policy}) at http://{host}:{port}", flush=True)

    asyncio.run(serve(service, listener, args.drain_timeout, ready))
    return 0


if __name__ == "__main__":
    sys.exit(router_main(sys.argv[1:]))
