"""Server-sent events that abort their request when the client goes away.

``SSEResponse`` streams its body while listening for ``http.disconnect``; on a
disconnect the body's generator is cancelled at its current ``await`` and
closed, so its ``finally`` (which aborts the request) always runs.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"


def sse_event(payload: object) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False).encode() + b"\n\n"


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, body: AsyncIterator[bytes]) -> None:
        super().__init__(body, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._body = body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    with contextlib.suppress(OSError):
                        await self.stream_response(send)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            aclose = getattr(self._body, "aclose", None)
            if aclose is not None:
                await aclose()
