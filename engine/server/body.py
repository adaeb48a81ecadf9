"""A request's raw body, read within ``--max-request-bytes``.

A body larger than the limit is refused with 413 before it is parsed: at once if
its ``Content-Length`` says so, else as soon as the bytes received pass the limit
(a chunked body). A client that leaves before its body is complete is its own
fault: one INFO line, and the request ends as if the client had disconnected later.
"""

from __future__ import annotations

import logging

from starlette.requests import ClientDisconnect, Request

from engine.server.errors import APIError, ClientGone

log = logging.getLogger(__name__)


def too_large(limit: int, size: str) -> APIError:
    return APIError(
        f"the request body is {size}; this server accepts at most {limit} bytes "
        "(--max-request-bytes)",
        status=413,
        code="request_too_large",
    )


async def read_body(request: Request, limit: int) -> bytes:
    """The body of ``request``: 413 past ``limit`` bytes, ``ClientGone`` if the client left."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise too_large(limit, f"{int(length)} bytes")
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise too_large(limit, f"over {limit} bytes")
            chunks.append(chunk)
    except ClientDisconnect:
        log.info(
            "%s %s: the client disconnected before its request body was complete (%d of %s bytes)",
            request.method,
            request.url.path,
            received,
            length or "?",
        )
        raise ClientGone("before its request body was complete") from None
    return b"".join(chunks)
