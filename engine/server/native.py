"""Native routes: ``/generate`` (with stage timestamps), ``/health``, ``/metrics``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import Request

from engine.ipc import messages
from engine.server.context import ServerContext, admit, respond
from engine.server.errors import APIError, error_body
from engine.server.frontend import RequestResult, RequestStream
from engine.server.protocol import GenerateBody
from engine.server.schema import request_body
from engine.server.sse import DONE, sse_event
from engine.server.translate import native_sampling_params, pd_route

router = APIRouter()


async def generate_events(stream: RequestStream, first: messages.TextItem) -> AsyncIterator[bytes]:
    try:
        item = first
        while True:
            payload: dict[str, object] = {"text": item.text, "output_ids": item.token_ids}
            if item.finish_reason is not None:
                payload["meta_info"] = stream.result.meta_info()
                yield sse_event(payload)
                break
            yield sse_event(payload)
            try:
                item = await stream.next()
            except APIError as exc:
                yield sse_event(error_body(exc.message, exc.status, code=exc.code))
                break
        yield DONE
    finally:
        stream.close()


@router.post("/generate", openapi_extra=request_body(GenerateBody))
async def generate(request: Request) -> Response:
    """Text or token ids in; text, token ids and per-stage timestamps (``meta_info``) out."""
    ctx, body = await admit(request, GenerateBody)
    if (body.text is None) == (body.input_ids is None):
        raise APIError("give exactly one of text and input_ids", param="text")
    req = messages.GenerateRequest(
        sampling=native_sampling_params(body.sampling_params, ctx.cfg.max_model_len),
        text=body.text,
        input_ids=body.input_ids,
        priority=body.priority,
        max_tokens_explicit=body.sampling_params.max_new_tokens is not None,
    )
    req.pd = pd_route(ctx.cfg.scheduler.role, body.pd, req.sampling)
    return await respond(request, ctx, req, body.stream, generate_events, final_body)


def final_body(result: RequestResult) -> dict[str, Any]:
    return {"text": result.text, "output_ids": result.token_ids, "meta_info": result.meta_info()}


@router.get("/health")
async def health(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    reason = ctx.unhealthy()
    if reason is not None:
        status = "draining" if ctx.draining and ctx.health() is None else "unhealthy"
        return JSONResponse({"status": status, "reason": reason}, status_code=503)
    replicas = ctx.frontend.replicas
    body: dict[str, Any] = {"status": "degraded" if replicas.down else "ok"}
    body["replicas"] = replicas.states()
    if replicas.down:
        body["reason"] = "; ".join(f"replica {r}: {why}" for r, why in replicas.down.items())
    return JSONResponse(body)


@router.post("/flush_router")
async def flush_router(request: Request) -> Response:
    """The router of the replicas forgets the prompts and sessions placed so far (a load
    generator calls it after its warm-up, so that a measured run starts as a new router
    would); open requests keep their replicas."""
    ctx: ServerContext = request.app.state.ctx
    ctx.authorize(request)
    ctx.frontend.replicas.core.flush()
    return JSONResponse({"flushed": True, "replicas": len(ctx.frontend.replicas.core.workers)})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    return Response(ctx.metrics.render(), media_type=CONTENT_TYPE_LATEST)
