"""The router's aiohttp app: forward generation requests to the worker the core picks.

A worker that cannot be reached before anything was sent is marked dead and
the request tries the next worker; one that breaks off afterwards fails that
request with a 502 (or, mid-stream, an SSE ``error`` event). A worker's own
errors (4xx, 5xx) come back as they are. A client that goes away cancels its
handler (the app runs with ``handler_cancellation``), which closes the
worker's connection and so aborts the request there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict
from typing import Any

import aiohttp
from aiohttp import web

from core.router import Health, NoWorkerAvailable
from engine.ipc.config import MAX_REQUEST_BYTES
from engine.router import metrics
from engine.router.keys import body_route
from engine.router.service import RouterService
from engine.router.upstream import END, Exchange, Failure, Head
from engine.server.errors import error_body

log = logging.getLogger("engine.router")
FORWARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
LIST_TIMEOUT = aiohttp.ClientTimeout(total=10)  # a worker's /v1/models, asked for a client


def error(message: str, status: int, code: str | None = None) -> web.Response:
    headers = {"Retry-After": "1"} if status == 503 else None
    return web.json_response(error_body(message, status, code=code), status=status, headers=headers)


@web.middleware
async def json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own 4xx (no such path, wrong method, body too large) as JSON error bodies."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return error(exc.reason, exc.status)


def create_app(services: Sequence[RouterService], forward_to_worker: Handler) -> web.Application:
    """The router's app over ``services``: one (``--worker``), or the prefill and the decode
    workers' (``--prefill``, ``--decode``); ``forward_to_worker`` answers generation requests."""
    app = web.Application(client_max_size=MAX_REQUEST_BYTES, middlewares=[json_errors])
    for path in FORWARDED_PATHS:
        app.router.add_post(path, forward_to_worker)

    async def health(request: web.Request) -> web.Response:
        states = {s.worker: s.health.value for svc in services for s in svc.core.stats()}
        if any(svc.draining for svc in services):
            return web.json_response({"status": "draining", "workers": states}, status=503)
        for svc in services:
            if all(s.health is not Health.HEALTHY for s in svc.core.stats()):
                status = " ".join(("no healthy", *filter(None, [svc.role]), "worker"))
                return web.json_response({"status": status, "workers": states}, status=503)
        return web.json_response({"status": "ok", "workers": states})

    async def get_metrics(request: web.Request) -> web.Response:
        return web.Response(
            text=metrics.render(services), headers={"Content-Type": metrics.CONTENT_TYPE}
        )

    async def models(request: web.Request) -> web.Response:
        for stat in services[-1].core.stats():
            if stat.health is Health.HEALTHY:
                try:
                    listing = services[-1].session.get(
                        f"{stat.worker}/v1/models", timeout=LIST_TIMEOUT
                    )
                    async with listing as reply:
                        body, status = await reply.read(), reply.status
                except Exception as exc:
                    log.warning("GET /v1/models on %s failed: %s", stat.worker, exc)
                    continue
                if status == 200:
                    body = cluster_cards(body, services)
                return web.Response(body=body, status=status, content_type="application/json")
        return error("no healthy worker to list the models", 503)

    async def flush_router(request: web.Request) -> web.Response:
        """Forget the prompts and sessions placed so far (``core.router.Router.flush``)."""
        for svc in services:
            svc.core.flush()
        workers = sum(len(svc.core.workers) for svc in services)
        return web.json_response({"flushed": True, "workers": workers})

    app.router.add_post("/flush_router", flush_router)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", get_metrics)
    app.router.add_get("/v1/models", models)
    return app


def cluster_cards(body: bytes, services: Sequence[RouterService]) -> bytes:
    """A worker's model listing as the router's: each card also says what serves behind the
    router (``dp`` workers, each its own server and frontend, their URLs, the router core's
    settings), so that ``sim validate`` against the router simulates that cluster; the
    worker's own step record does not stand for the cluster's (``record_steps`` null). Behind
    a prefill/decode router the workers are the decode servers, ``prefill_workers`` the
    prefill ones, and the role ``disaggregated``. A listing that is not JSON cards is passed
    on as it is."""
    try:
        listing = json.loads(body)
        cards = listing["data"]
    except (ValueError, KeyError, TypeError):
        return body
    service = services[-1]
    workers = [stat.worker for stat in service.core.stats()]
    for card in cards if isinstance(cards, list) else []:
        if isinstance(card, dict):
            card.update(dp=len(workers), workers=workers, shared_frontend=False,
                        router=asdict(service.core.config), record_steps=None)  # fmt: skip
            if len(services) > 1:
                prefill = [stat.worker for stat in services[0].core.stats()]
                card.update(role="disaggregated", prefill_workers=prefill,
                            handoff_address=None, kv_address=None)  # fmt: skip
    return json.dumps(listing).encode()


async def read_payload(
    service: RouterService, request: web.Request
) -> dict[str, Any] | web.Response:
    """The request's JSON object, or the error to answer (a bad body, or the router drains)."""
    body = await request.read()
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        service.rejected["bad_request"] += 1
        return error(f"the request body is not valid JSON: {exc}", 400)
    if not isinstance(payload, dict):
        service.rejected["bad_request"] += 1
        return error("the request body must be a JSON object", 400)
    if service.draining:
        service.rejected["draining"] += 1
        return error("the router is shutting down; retry on another router", 503)
    return payload


def failure_response(failure: Failure) -> web.Response:
    """What the client gets for ``failure``: its own error body, or a 502 from its message."""
    if failure.body:
        return web.Response(
            body=failure.body, status=failure.status, content_type="application/json"
        )
    return error(failure.message, failure.status, "worker_failed")


async def forward(service: RouterService, request: web.Request) -> web.StreamResponse:
    payload = await read_payload(service, request)
    if isinstance(payload, web.Response):
        return payload
    body = await request.read()
    route = body_route(service.new_rid(), payload)
    tried: set[str] = set()
    while True:
        try:
            worker = service.core.route(route, service.now(), exclude=tried)
        except NoWorkerAvailable:
            service.rejected["no_worker"] += 1
            return error("no healthy worker to serve this request", 503, "no_worker")
        exchange = service.open(route.rid, worker)
        exchange.start(request.path, body, request.headers)
        first = await exchange.next()
        if isinstance(first, Failure) and first.connect:
            service.end(route.rid, finished=False)
            service.mark_dead(worker, first.message)
            tried.add(worker)
            continue
        break
    if isinstance(first, Failure):
        service.end(route.rid, finished=False)
        service.suspect(worker)
        return failure_response(first)
    assert isinstance(first, Head)
    if first.status == 200 and first.content_type.startswith("text/event-stream"):
        return (await stream(service, route.rid, exchange, request, first))[0]
    return (await collect(service, route.rid, exchange, first))[0]


async def collect(
    service: RouterService, rid: str, exchange: Exchange, head: Head
) -> tuple[web.Response, bool]:
    """The whole body of a non-streamed answer (or a worker's error), passed on as it is;
    and whether it is the worker's answer (not a failure)."""
    chunks: list[bytes] = []
    try:
        while True:
            item = await exchange.next()
            if isinstance(item, Failure):
                service.end(rid, finished=False)
                service.suspect(exchange.worker)
                return failure_response(item), False
            if item == END:
                break
            assert isinstance(item, bytes)
            chunks.append(item)
    finally:
        await exchange.close()
    service.end(rid, finished=head.status == 200)
    headers = {"Content-Type": head.content_type} if head.content_type else None
    response = web.Response(body=b"".join(chunks), status=head.status, headers=headers)
    return response, head.status == 200


async def stream(
    service: RouterService, rid: str, exchange: Exchange, request: web.Request, head: Head
) -> tuple[web.StreamResponse, bool]:
    """The worker's SSE bytes as they come; a failure becomes an ``error`` event, then the end.
    Also whether the stream ended as the worker ended it."""
    response = web.StreamResponse(headers={**SSE_HEADERS, "Content-Type": head.content_type})
    finished = False
    try:
        await response.prepare(request)
        while True:
            item = await exchange.next()
            if isinstance(item, Failure):
                service.suspect(exchange.worker)
                event = error_body(item.message, item.status, code="worker_failed")
                await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
                break
            if item == END:
                finished = True
                break
            assert isinstance(item, bytes)
            await response.write(item)
        await response.write_eof()
    except ConnectionResetError:
        log.debug("request %s: the client went away", rid)
    finally:
        await exchange.close()
        service.end(rid, finished)
    return response, finished
