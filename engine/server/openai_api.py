"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` (OpenAI wire format)."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from engine.ipc import messages
from engine.sampling.logprobs import TokenLogprob
from engine.server.context import ServerContext, admit, respond
from engine.server.errors import APIError, error_body
from engine.server.frontend import RequestResult, RequestStream
from engine.server.logprob_format import chat_logprobs, completion_logprobs
from engine.server.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from engine.server.schema import request_body
from engine.server.sse import DONE, sse_event
from engine.server.translate import (
    DEFAULT_COMPLETION_TOKENS,
    chat_logprobs_wanted,
    chat_messages,
    completion_prompt,
    pd_route,
    sampling_params,
)

log = logging.getLogger(__name__)
router = APIRouter()


def usage(result: RequestResult) -> dict[str, Any]:
    completion = len(result.token_ids)
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": result.prompt_tokens + completion,
        "prompt_tokens_details": {"cached_tokens": result.cached_tokens},
    }


class Shape:
    """How one request's responses look: chat (``delta``/``message``) or text (``text``),
    with or without log-probs, and (text only) with the prompt echoed first.

    With ``meta_info`` (the body's ``return_meta_info``), the final chunk of a stream
    (the one with ``finish_reason``) or the whole response also carries ``meta_info``:
    the request's stage timestamps, as ``/generate`` returns them.
    """

    def __init__(
        self,
        chat: bool,
        rid: str,
        model: str,
        logprobs: bool,
        echo: str | None = None,
        meta_info: bool = False,
    ) -> None:
        self.chat = chat
        self.meta_info = meta_info
        self.id = f"chatcmpl-{rid}" if chat else f"cmpl-{rid}"
        self.model = model
        self.created = int(time.time())
        self.logprobs = logprobs
        self.echo = echo  # the prompt's text, "" to take it from the pipeline; None: no echo
        self.offset = 0  # characters of text streamed so far (completions' text_offset)

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _logprobs(
        self, entries: list[TokenLogprob], pieces: dict[int, bytes]
    ) -> dict[str, Any] | None:
        if not self.logprobs:
            return None
        if self.chat:
            return chat_logprobs(entries, pieces)
        body, self.offset = completion_logprobs(entries, pieces, self.offset)
        return body

    def echo_text(self, result: RequestResult) -> str:
        return self.echo or result.prompt_text or ""

    def chunk(
        self, text: str | None, finish: str | None, item: messages.TextItem | None = None
    ) -> dict[str, Any]:
        logprobs = self._logprobs(item.logprobs, item.pieces) if item is not None else None
        choice: dict[str, Any] = {"index": 0, "logprobs": logprobs, "finish_reason": finish}
        if self.chat:
            choice["delta"] = {} if text is None else {"content": text}
            return self.envelope("chat.completion.chunk", [choice])
        choice["text"] = text or ""
        return self.envelope("text_completion", [choice])

    def role_chunk(self) -> dict[str, Any]:
        delta = {"role": "assistant", "content": ""}
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}
        return self.envelope("chat.completion.chunk", [choice])

    def echo_chunk(self, result: RequestResult) -> dict[str, Any]:
        entries = result.prompt_logprobs or []
        choice = {
            "index": 0,
            "text": self.echo_text(result),
            "logprobs": self._logprobs(entries, result.pieces),
            "finish_reason": None,
        }
        return self.envelope("text_completion", [choice])

    def final(self, result: RequestResult) -> dict[str, Any]:
        entries = result.logprobs
        text = result.text
        if self.echo is not None:
            entries = (result.prompt_logprobs or []) + entries
            text = self.echo_text(result) + text
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": self._logprobs(entries, result.pieces),
            "finish_reason": result.finish_reason,
        }
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            body = self.envelope("chat.completion", [choice])
        else:
            choice["text"] = text
            body = self.envelope("text_completion", [choice])
        body["usage"] = usage(result)
        if self.meta_info:
            body["meta_info"] = result.meta_info()
        return body

    def usage_chunk(self, result: RequestResult) -> dict[str, Any]:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body = self.envelope(obj, [])
        body["usage"] = usage(result)
        return body


async def stream_events(
    shape: Shape, stream: RequestStream, first: messages.TextItem, include_usage: bool
) -> AsyncIterator[bytes]:
    """SSE chunks of one request; leaving early (a disconnect) aborts it.

    A request that fails after its stream started (a timeout, a dead child, the
    server stopping) ends with an ``{"error": ...}`` event, then ``[DONE]``.
    """
    try:
        if shape.chat:
            yield sse_event(shape.role_chunk())
        elif shape.echo is not None:
            yield sse_event(shape.echo_chunk(stream.result))
        item = first
        while True:
            if item.text or (shape.logprobs and item.logprobs):
                yield sse_event(shape.chunk(item.text, None, item))
            if item.finish_reason is not None:
                last = shape.chunk(None if shape.chat else "", item.finish_reason)
                if shape.meta_info:
                    last["meta_info"] = stream.result.meta_info()
                yield sse_event(last)
                break
            try:
                item = await stream.next()
            except APIError as exc:
                yield sse_event(error_body(exc.message, exc.status, code=exc.code))
                break
        if include_usage:
            yield sse_event(shape.usage_chunk(stream.result))
        yield DONE
    finally:
        stream.close()


async def answer(
    request: Request,
    ctx: ServerContext,
    body: SamplingFields,
    shape: Shape,
    req: messages.GenerateRequest,
) -> Response:
    """Answer ``req`` in ``shape``, streamed if ``body`` asks for it."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    req.pd = pd_route(ctx.cfg.scheduler.role, body.pd, req.sampling)
    req.session = getattr(body, "prompt_cache_key", None) or body.user
    for field in ("user", "safety_identifier", "prompt_cache_key"):
        value = getattr(body, field, None)
        if value is not None:
            log.info("rid %s: %s %r", req.rid, field, value)

    def events(stream: RequestStream, first: messages.TextItem) -> AsyncIterator[bytes]:
        return stream_events(shape, stream, first, include_usage)

    return await respond(request, ctx, req, body.stream, events, shape.final)


@router.post("/v1/chat/completions", openapi_extra=request_body(ChatCompletionRequest))
async def chat_completions(request: Request) -> Response:
    ctx, body = await admit(request, ChatCompletionRequest)
    ctx.check_model(body.model)
    chat = chat_messages(body)
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    limit = ctx.cfg.max_model_len
    logprobs = chat_logprobs_wanted(body)
    req = messages.GenerateRequest(
        sampling=sampling_params(
            body, limit if max_tokens is None else max_tokens, limit, logprobs=logprobs
        ),
        messages=chat,
        priority=body.priority,
        max_tokens_explicit=max_tokens is not None,
    )
    shape = Shape(
        True, req.rid, ctx.cfg.model, logprobs is not None, meta_info=body.return_meta_info
    )
    return await answer(request, ctx, body, shape, req)


@router.post("/v1/completions", openapi_extra=request_body(CompletionRequest))
async def completions(request: Request) -> Response:
    ctx, body = await admit(request, CompletionRequest)
    ctx.check_model(body.model)
    text, ids = completion_prompt(body)
    max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS
    prompt_logprobs = None
    if body.echo and (body.logprobs is not None or text is None):
        prompt_logprobs = body.logprobs or 0  # also how a prompt of token ids is decoded
    req = messages.GenerateRequest(
        sampling=sampling_params(
            body, max_tokens, ctx.cfg.max_model_len, body.logprobs, prompt_logprobs
        ),
        text=text,
        input_ids=ids,
        priority=body.priority,
        max_tokens_explicit=body.max_tokens is not None,
    )
    echo = (text or "") if body.echo else None
    shape = Shape(
        False, req.rid, ctx.cfg.model, body.logprobs is not None, echo, body.return_meta_info
    )
    return await answer(request, ctx, body, shape, req)


@router.get("/v1/models")
async def models(request: Request) -> Response:
    ctx: ServerContext = request.app.state.ctx
    ctx.authorize(request)
    card = {
        "id": ctx.cfg.model,
        "object": "model",
        "created": int(ctx.started),
        "owned_by": "engine",
        "root": ctx.cfg.model_path,
        "max_model_len": ctx.cfg.max_model_len,
        "overlap_scheduling": ctx.cfg.overlap_on,
        "record_steps": ctx.cfg.record_steps,
        "hardware": ctx.cfg.hardware,
        "scheduler": asdict(ctx.cfg.scheduler),
        "layout": ctx.cfg.layout,
        "num_tokenizers": ctx.cfg.num_tokenizers,
        "dp": ctx.cfg.dp_size,
        "gpu_share": ctx.cfg.gpu_share,
        "router": asdict(ctx.cfg.router),
        "speculative": ctx.cfg.speculative.card(ctx.cfg.scheduler),
        "role": ctx.cfg.scheduler.role,
        "handoff_address": ctx.cfg.handoff_addr or None,
        "kv_address": ctx.cfg.kv_addr or None,
    }
    return JSONResponse({"object": "list", "data": [card]})
