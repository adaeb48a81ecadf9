"""What every route needs: the config, the pipeline, the metrics and the health of the server."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.server.body import read_body
from engine.server.errors import APIError, ClientGone
from engine.server.frontend import Frontend, RequestResult, RequestStream
from engine.server.metrics import ServerMetrics
from engine.server.protocol import B, parse_body
from engine.server.sse import SSEResponse

T = TypeVar("T")
DISCONNECT_POLL_S = 0.5
UNHEALTHY_RETRY_AFTER_S = 5


@dataclass
class ServerContext:
    """``health()`` names the dead child, if any; ``draining`` is set by SIGTERM."""

    cfg: ServeConfig
    frontend: Frontend
    metrics: ServerMetrics
    health: Callable[[], str | None]
    started: float = field(default_factory=time.time)
    draining: bool = False

    def authorize(self, request: Request) -> None:
        """401 unless the server has no API key or the request bears it."""
        key = self.cfg.api_key
        if key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), key):
            raise APIError("invalid or missing API key", status=401, code="invalid_api_key")

    def check_model(self, name: str | None) -> None:
        if name is None or name in (self.cfg.model, self.cfg.model_path):
            return
        raise APIError(
            f"the model {name!r} does not exist; this server serves {self.cfg.model!r}",
            status=404,
            param="model",
            code="model_not_found",
        )

    def unhealthy(self) -> str | None:
        """Why the server takes no new requests (a dead child, or draining), or None."""
        dead = self.health()
        if dead is not None:
            return dead
        return "draining for shutdown" if self.draining else None

    def check_healthy(self) -> None:
        """503 with ``Retry-After`` while the server is shutting down."""
        reason = self.unhealthy()
        if reason is not None:
            self.metrics.on_rejected("shutting_down")
            raise APIError(
                f"the server is shutting down: {reason}",
                status=503,
                code="shutting_down",
                retry_after=UNHEALTHY_RETRY_AFTER_S,
            )


async def admit(request: Request, body_type: type[B]) -> tuple[ServerContext, B]:
    """The server's context and the parsed body of an authorized request the server can take."""
    ctx: ServerContext = request.app.state.ctx
    ctx.authorize(request)
    ctx.check_healthy()
    body = parse_body(await read_body(request, ctx.cfg.max_request_bytes), body_type)
    ctx.frontend.admit()
    return ctx, body


async def respond(
    request: Request,
    ctx: ServerContext,
    req: messages.GenerateRequest,
    streaming: bool,
    events: Callable[[RequestStream, messages.TextItem], AsyncIterator[bytes]],
    final: Callable[[RequestResult], dict[str, Any]],
) -> Response:
    """Submit ``req``; answer with the SSE ``events`` of its stream or the ``final`` JSON body."""
    stream = ctx.frontend.submit(req)
    if streaming:
        first = await await_or_abort(request, stream, stream.next())
        return SSEResponse(events(stream, first))
    result = await await_or_abort(request, stream, stream.collect())
    return JSONResponse(final(result))


async def await_or_abort(request: Request, stream: RequestStream, work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first (then abort and raise ``ClientGone``).

    An ``APIError`` of the pipeline (rejected, failed, timed out) propagates as it is.
    """
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientGone(stream.rid)
    except BaseException:
        stream.close()
        raise
    finally:
        if not task.done():
            task.cancel()
