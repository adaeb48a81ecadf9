"""``engine router --worker URL [--worker URL ...] --router P``: route requests over workers;
``engine router --prefill URL ... --decode URL ...``: over prefill/decode pairs
(``engine.router.pd``).

The router's settings are the ``--router-*`` flags ``engine serve --dp`` and ``sim replay``
take (``core.router.options``); each also answers to its field's name (``--policy``, ``--load``).
With prefill and decode workers each set has a router core of its own with these settings.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import socket
import sys
from collections.abc import Awaitable, Callable

from aiohttp import web

from core.router.options import add_router_flags, router_config
from engine.router.app import Handler, create_app, forward
from engine.router.pd import PDCluster, forward_pd
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
        default=[],
        metavar="URL",
        help="a worker's base URL, e.g. http://127.0.0.1:8001 (repeat for each)",
    )
    p.add_argument(
        "--prefill",
        action="append",
        default=[],
        metavar="URL",
        help="a prefill server's base URL (engine serve --role prefill; repeat for each): "
        "with --decode, every request goes to a prefill and a decode server, in place of "
        "--worker",
    )
    p.add_argument(
        "--decode",
        action="append",
        default=[],
        metavar="URL",
        help="a decode server's base URL (engine serve --role decode; repeat for each)",
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
    services: list[RouterService],
    forward_to_worker: Handler,
    listener: socket.socket,
    drain_timeout: float,
    ready: Callable[[], None],
    closing: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Serve on ``listener`` until a signal: SIGTERM or SIGINT refuses new requests (503),
    waits for the open ones up to ``drain_timeout``, then stops; a second signal stops at once.
    Whatever is still open then fails with an error (after ``closing``, if given)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if services[0].draining:
            stop.set()
            return
        for service in services:
            service.draining = True
        drainer = loop.create_task(drain(services, drain_timeout))
        drainer.add_done_callback(lambda _: stop.set())

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    for service in services:
        await service.start()
    await asyncio.gather(*(service.probe_all() for service in services))
    checkers = [loop.create_task(service.health_loop()) for service in services]
    runner = web.AppRunner(
        create_app(services, forward_to_worker),
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=2,
    )
    await runner.setup()
    await web.SockSite(runner, listener).start()
    ready()
    try:
        await stop.wait()
    finally:
        for checker in checkers:
            checker.cancel()
        if closing is not None:
            await closing()
        for service in services:
            await service.close()
        await runner.cleanup()


async def drain(services: list[RouterService], timeout: float) -> None:
    def outstanding() -> int:
        return sum(service.core.outstanding for service in services)

    log.info("draining: %d open requests, up to %.1f s", outstanding(), timeout)
    deadline = services[0].now() + timeout
    while outstanding() and services[0].now() < deadline:
        await asyncio.sleep(0.05)


def worker_urls(args: argparse.Namespace) -> dict[str, list[str]]:
    """The workers by role (``""``: ``--worker``); ``ValueError`` on a bad combination."""
    urls = {
        role: [worker_url(w) for w in getattr(args, role or "worker")]
        for role in ("", "prefill", "decode")
    }
    every = [w for workers in urls.values() for w in workers]
    if len(set(every)) != len(every):
        raise ValueError("a worker is given twice")
    if urls[""] and (urls["prefill"] or urls["decode"]):
        raise ValueError("give --worker URLs, or --prefill and --decode URLs, not both")
    if not urls[""] and not (urls["prefill"] and urls["decode"]):
        raise ValueError(
            "give at least one --worker URL, or at least one --prefill and one --decode URL"
        )
    return urls


def router_main(argv: list[str]) -> int:
    """Run the router until SIGTERM/SIGINT; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, "router")
    try:
        workers = worker_urls(args)
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
    closing: Callable[[], Awaitable[None]] | None = None
    if workers[""]:
        service = RouterService(workers[""], config, check)
        services = [service]

        async def forward_to_worker(request: web.Request) -> web.StreamResponse:
            return await forward(service, request)

        mode = config.policy
    else:
        pd = PDCluster(
            *(RouterService(workers[r], config, check, r) for r in ("prefill", "decode"))
        )
        services = pd.services

        async def forward_to_worker(request: web.Request) -> web.StreamResponse:
            return await forward_pd(pd, request)

        closing = pd.close
        mode = f"{config.policy}, prefill/decode"

    def ready() -> None:
        print(f"engine router ({mode}) at http://{host}:{port}", flush=True)

    asyncio.run(serve(services, forward_to_worker, listener, args.drain_timeout, ready, closing))
    return 0


if __name__ == "__main__":
    sys.exit(router_main(sys.argv[1:]))
