"""The FastAPI application of ``engine serve``."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import Request

from engine.ipc.config import ServeConfig
from engine.ipc.heap import freeze_heap
from engine.ipc.host_profile import serving
from engine.server import native, openai_api
from engine.server.context import ServerContext
from engine.server.errors import APIError, ClientGone, error_body, error_response
from engine.server.frontend import Frontend
from engine.server.metrics import ServerMetrics
from engine.server.protocol import REQUEST_BODIES
from engine.server.schema import install_openapi

log = logging.getLogger(__name__)
CLIENT_CLOSED = 499


def create_app(
    cfg: ServeConfig,
    health: Callable[[], str | None],
    pools: Mapping[int, tuple[int, int]] | None = None,
) -> FastAPI:
    """The app; its lifespan opens the sockets to the tokenizers and from the pipeline.
    ``pools``: each replica's KV pages and host KV pages as its scheduler reported them
    ready (in ``/metrics`` from the start)."""
    draft_tokens = cfg.scheduler.num_draft_tokens if cfg.speculative.on else 0
    metrics = ServerMetrics(cfg.model, draft_tokens, cfg.scheduler.role != "colocated")
    frontend = Frontend(cfg, metrics, pools or {})

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await frontend.start()
        if cfg.gc_freeze:
            freeze_heap()
        serving()
        try:
            yield
        finally:
            await frontend.stop()

    app = FastAPI(title="engine", lifespan=lifespan)
    app.state.ctx = ServerContext(cfg=cfg, frontend=frontend, metrics=metrics, health=health)
    app.include_router(openai_api.router)
    app.include_router(native.router)
    install_openapi(app, REQUEST_BODIES)

    @app.exception_handler(APIError)
    async def on_api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc)

    @app.exception_handler(ClientGone)
    async def on_client_gone(request: Request, exc: ClientGone) -> Response:
        return Response(status_code=CLIENT_CLOSED)

    @app.exception_handler(HTTPException)
    async def on_http_error(request: Request, exc: HTTPException) -> Response:
        return JSONResponse(
            error_body(str(exc.detail), exc.status_code), status_code=exc.status_code
        )

    @app.exception_handler(RequestValidationError)
    async def on_validation_error(request: Request, exc: RequestValidationError) -> Response:
        return JSONResponse(error_body(str(exc), 400), status_code=400)

    return app
