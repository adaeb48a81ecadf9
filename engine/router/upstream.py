"""One request's exchange with a worker, run as a task that a health check can cut short.

A pump task sends the request (aiohttp's client) and puts what comes back on a
queue: first a ``Head`` (status and content type) or a ``Failure``, then the
body's chunks, then ``END`` (or a ``Failure``). ``fail`` cancels the pump and
queues a ``Failure``, so whoever reads the queue (the client's response) always
ends, even when the worker hangs. A cancelled pump closes its connection, which
aborts the request on the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

FORWARDED_HEADERS = ("authorization", "content-type", "accept")


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    content_type: str


@dataclass(frozen=True, slots=True)
class Failure:
    """The worker could not be reached (``connect``: nothing was sent) or broke off; or the
    exchange was failed from outside (``Exchange.fail``), with the error ``status`` and
    ``body`` (empty: an error body from ``message``) its client should get."""

    message: str
    connect: bool = False
    status: int = 502
    body: bytes = b""


END = b""
Item = Head | Failure | bytes


class Exchange:
    def __init__(self, session: aiohttp.ClientSession, worker: str) -> None:
        self.worker = worker
        self.queue: asyncio.Queue[Item] = asyncio.Queue()
        self._session = session
        self._task: asyncio.Task[None] | None = None

    def start(self, path: str, body: bytes, headers: Mapping[str, str]) -> None:
        sent = {k: v for k, v in headers.items() if k.lower() in FORWARDED_HEADERS}
        self._task = asyncio.create_task(self._pump(path, body, sent))

    async def _pump(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        put = self.queue.put_nowait
        try:
            async with self._session.post(self.worker + path, data=body, headers=headers) as reply:
                put(Head(reply.status, reply.headers.get("Content-Type", "")))
                async for chunk in reply.content.iter_any():
                    put(chunk)
            put(END)
        except aiohttp.ClientConnectorError as exc:
            put(Failure(f"cannot connect to worker {self.worker}: {exc}", connect=True))
        except (aiohttp.ClientError, TimeoutError) as exc:
            put(Failure(f"worker {self.worker} broke off: {type(exc).__name__}: {exc}"))

    async def next(self) -> Item:
        return await self.queue.get()

    def fail(self, message: str, status: int = 502, body: bytes = b"") -> None:
        """End this exchange now (its worker is down, or its other half failed); the reader
        gets ``Failure(message, status=status, body=body)``."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
        self.queue.put_nowait(Failure(message, status=status, body=body))

    async def close(self) -> None:
        """Stop the pump (the client went away): closing the connection aborts the request."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
