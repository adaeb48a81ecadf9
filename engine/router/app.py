"""The router's FastAPI app: forward generation requests to the worker the core picks.

A worker that cannot be reached before anything was sent is marked dead and
the request tries the next worker; one that breaks off afterwards fails that
request with a 502 (or, mid-stream, an SSE ``error`` event). A worker's own
errors (4xx, 5xx) come back as they are.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import Request

from core.router import Health, NoWorkerAvailable
from engine.router import metrics
from engine.router.keys import route_request
from engine.router.service import RouterService
from engine.router.upstream import END, Exchange, Failure, Head
from engine.server.errors import error_body
from engine.server.sse import SSEResponse

log = logging.getLogger("engine.router")
FORWARDED_PATHS = ("/v1/chat/completions", "/v1/completions", "/generate")


def error(message: str, status: int, code: str | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} if status == 503 else None
    return JSONResponse(error_body(message, status, code=code), status_code=status, headers=headers)


def create_app(service: RouterService, on_ready: Callable[[], None] | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await service.probe_all()
        checker = asyncio.create_task(service.health_loop())
        if on_ready is not None:
            on_ready()
        try:
            yield
        finally:
            checker.cancel()
            await service.close()

    app = FastAPI(title="engine router", lifespan=lifespan)
    app.state.service = service

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return error(str(exc.detail), exc.status_code)

    for path in FORWARDED_PATHS:
        app.add_api_route(path, forward, methods=["POST"], include_in_schema=False)

    @app.get("/health")
    async def health() -> Response:
        states = {s.worker: s.health.value for s in service.core.stats()}
        if service.draining:
            return JSONResponse({"status": "draining", "workers": states}, status_code=503)
        if Health.HEALTHY not in states.values():
            return JSONResponse({"status": "no healthy worker", "workers": states}, 503)
        return JSONResponse({"status": "ok", "workers": states})

    @app.get("/metrics")
    async def get_metrics() -> Response:
        return Response(metrics.render(service), media_type=metrics.CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> Response:
        for stat in service.core.stats():
            if stat.health is Health.HEALTHY:
                try:
                    r = await service.client.get(f"{stat.worker}/v1/models", timeout=10)
                except Exception as exc:
                    log.warning("GET /v1/models on %s failed: %s", stat.worker, exc)
                    continue
                return Response(r.content, r.status_code, media_type="application/json")
        return error("no healthy worker to list the models", 503)

    return app


async def forward(request: Request) -> Response:
    service: RouterService = request.app.state.service
    body = await request.body()
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
    route = route_request(service.new_rid(), payload)
    tried: set[str] = set()
    while True:
        try:
            worker = service.core.route(route, service.now(), exclude=tried)
        except NoWorkerAvailable:
            service.rejected["no_worker"] += 1
            return error("no healthy worker to serve this request", 503, "no_worker")
        exchange = service.open(route.rid, worker)
        exchange.start(request.url.path, body, dict(request.headers))
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
        return error(first.message, 502, "worker_failed")
    assert isinstance(first, Head)
    if first.status == 200 and first.content_type.startswith("text/event-stream"):
        return SSEResponse(stream(service, route.rid, exchange))
    return await collect(service, route.rid, exchange, first)


async def collect(service: RouterService, rid: str, exchange: Exchange, head: Head) -> Response:
    """The whole body of a non-streamed answer (or a worker's error), passed on as it is."""
    chunks: list[bytes] = []
    try:
        while True:
            item = await exchange.next()
            if isinstance(item, Failure):
                service.end(rid, finished=False)
                service.suspect(exchange.worker)
                return error(item.message, 502, "worker_failed")
            if item == END:
                break
            assert isinstance(item, bytes)
            chunks.append(item)
    finally:
        await exchange.close()
    service.end(rid, finished=head.status == 200)
    return Response(b"".join(chunks), head.status, media_type=head.content_type or None)


async def stream(service: RouterService, rid: str, exchange: Exchange) -> AsyncIterator[bytes]:
    """The worker's SSE bytes as they come; a failure becomes an ``error`` event, then the end."""
    finished = False
    try:
        while True:
            item = await exchange.next()
            if isinstance(item, Failure):
                service.suspect(exchange.worker)
                event = error_body(item.message, 502, code="worker_failed")
                yield b"data: " + json.dumps(event).encode() + b"\n\n"
                return
            if item == END:
                finished = True
                return
            assert isinstance(item, bytes)
            yield item
    finally:
        await exchange.close()
        service.end(rid, finished)
