"""``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` (OpenAI wire format)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from engine import messages
from engine.server.context import ServerContext, admit, respond
from engine.server.errors import APIError, error_body
from engine.server.frontend import RequestError, RequestResult, RequestStream
from engine.server.protocol import (
    DEFAULT_COMPLETION_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    SamplingFields,
    chat_messages,
    completion_prompt,
    sampling_params,
)
from engine.server.sse import DONE, sse_event

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
    """How one endpoint's responses look: chat (``delta``/``message``) or text (``text``).

    With ``meta_info`` (the body's ``return_meta_info``), the final chunk of a stream
    (the one with ``finish_reason``) or the whole response also carries ``meta_info``:
    the request's stage timestamps, as ``/generate`` returns them.
    """

    def __init__(self, chat: bool, rid: str, model: str, meta_info: bool = False) -> None:
        self.chat = chat
        self.meta_info = meta_info
        self.id = f"chatcmpl-{rid}" if chat else f"cmpl-{rid}"
        self.model = model
        self.created = int(time.time())

    def envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def chunk(self, text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish}
        if self.chat:
            delta: dict[str, Any] = {}
            if role:
                delta["role"] = "assistant"
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
            return self.envelope("chat.completion.chunk", [choice])
        choice["text"] = text or ""
        return self.envelope("text_completion", [choice])

    def final(self, result: RequestResult) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "logprobs": None,
            "finish_reason": result.finish_reason,
        }
        if self.chat:
            choice["message"] = {"role": "assistant", "content": result.text}
            body = self.envelope("chat.completion", [choice])
        else:
            choice["text"] = result.text
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
    """SSE chunks of one request; leaving early (a disconnect) aborts it."""
    try:
        if shape.chat:
            yield sse_event(shape.chunk("", None, role=True))
        item = first
        while True:
            if item.text:
                yield sse_event(shape.chunk(item.text, None))
            if item.finish_reason is not None:
                last = shape.chunk(None if shape.chat else "", item.finish_reason)
                if shape.meta_info:
                    last["meta_info"] = stream.result.meta_info()
                yield sse_event(last)
                break
            try:
                item = await stream.next()
            except RequestError as exc:
                yield sse_event(error_body(exc.message, exc.status))
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
    chat: bool,
    req: messages.GenerateRequest,
) -> Response:
    """Answer ``req`` as a chat or a text completion, streamed if ``body`` asks for it."""
    shape = Shape(chat, req.rid, ctx.cfg.model, body.return_meta_info)
    include_usage = body.include_usage()

    def events(stream: RequestStream, first: messages.TextItem) -> AsyncIterator[bytes]:
        return stream_events(shape, stream, first, include_usage)

    return await respond(request, ctx, req, body.stream, events, shape.final)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    ctx, body = await admit(request, ChatCompletionRequest)
    ctx.check_model(body.model)
    chat = chat_messages(body)
    max_tokens = body.max_completion_tokens
    if max_tokens is None:
        max_tokens = body.max_tokens
    limit = ctx.cfg.max_model_len
    req = messages.GenerateRequest(
        sampling=sampling_params(body, limit if max_tokens is None else max_tokens, limit),
        messages=chat,
        priority=body.priority,
        max_tokens_explicit=max_tokens is not None,
    )
    return await answer(request, ctx, body, True, req)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    ctx, body = await admit(request, CompletionRequest)
    ctx.check_model(body.model)
    if body.echo:
        raise APIError("echo is not supported", param="echo")
    text, ids = completion_prompt(body)
    max_tokens = body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS
    req = messages.GenerateRequest(
        sampling=sampling_params(body, max_tokens, ctx.cfg.max_model_len),
        text=text,
        input_ids=ids,
        priority=body.priority,
        max_tokens_explicit=body.max_tokens is not None,
    )
    return await answer(request, ctx, body, False, req)


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
    }
    return JSONResponse({"object": "list", "data": [card]})
