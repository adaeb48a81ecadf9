"""One streamed ``/v1/completions`` request of a benchmark, timed at the client.

Times are seconds on the benchmark's clock (``time.perf_counter`` minus the run's
start). A chunk counts as a token chunk when it carries text; the server's
``usage`` (``stream_options.include_usage``) gives the token counts when it
sends them. With ``meta_info`` on (this engine's ``return_meta_info``
extension) the final chunk's stage timestamps are kept as the server sent them
(epoch seconds).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp.http_exceptions import HttpProcessingError

from schema.traces.record import TraceRequest


@dataclass(frozen=True, slots=True)
class Target:
    """Where and how to send: the server's base URL, model name and options."""

    url: str
    model: str
    meta_info: bool
    api_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}


@dataclass(slots=True)
class RequestRecord:
    """What the client saw of one request. ``status``: completed, rejected (an HTTP error
    status: the server refused it) or failed (the connection or the stream broke)."""

    rid: str
    scheduled: float
    input_length: int
    output_length: int
    sent: float = float("nan")
    status: str = "pending"
    reason: str = ""
    chunk_times: list[float] = field(default_factory=list)
    finished: float = float("nan")
    usage: dict[str, Any] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)


def request_body(target: Target, req: TraceRequest, prompt: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": target.model,
        "prompt": prompt,
        "max_tokens": req.output_length,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if target.meta_info:
        body["return_meta_info"] = True
    return body


def _on_chunk(record: RequestRecord, data: dict[str, Any], now: float) -> None:
    if "error" in data:
        record.status, record.reason = "failed", str(data["error"].get("message", data))
        return
    for choice in data.get("choices") or []:
        if choice.get("text"):
            record.chunk_times.append(now)
    if data.get("usage"):
        record.usage = data["usage"]
    if data.get("meta_info"):
        record.meta = data["meta_info"]


async def send(
    client: aiohttp.ClientSession,
    target: Target,
    req: TraceRequest,
    prompt: str,
    clock0: float,
) -> RequestRecord:
    """Send ``req`` now and read its stream to the end; never raises for a bad request."""
    record = RequestRecord(req.rid, req.arrival, req.input_length, req.output_length)
    record.sent = time.perf_counter() - clock0
    body = request_body(target, req, prompt)
    try:
        async with client.post(
            f"{target.url}/v1/completions", json=body, headers=target.headers()
        ) as reply:
            if reply.status != 200:
                text = (await reply.read()).decode(errors="replace")
                record.status, record.reason = "rejected", f"HTTP {reply.status}: {text}"
                return record
            async for raw in reply.content:
                if not raw.startswith(b"data:"):
                    continue
                payload = raw[5:].strip()
                if payload == b"[DONE]":
                    break
                _on_chunk(record, json.loads(payload), time.perf_counter() - clock0)
    except (aiohttp.ClientError, HttpProcessingError, TimeoutError, ValueError) as exc:
        record.status, record.reason = "failed", f"{type(exc).__name__}: {exc}"
    record.finished = time.perf_counter() - clock0
    if record.status == "pending":
        record.status = "completed" if record.chunk_times else "failed"
        record.reason = "" if record.chunk_times else "the stream carried no tokens"
    return record
