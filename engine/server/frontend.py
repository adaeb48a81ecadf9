"""The frontend's side of the pipeline: submit requests, route their outputs back by rid.

One ``Frontend`` per server process. ``submit`` sends a request to a tokenizer
worker (round-robin) and returns a ``RequestStream``; a background task reads
``TextBatch`` messages and puts each item on the queue of its rid. Aborts go
to the worker that got the request, so they arrive after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time

import zmq
import zmq.asyncio

from engine import messages
from engine.launch.config import ServeConfig
from engine.server.metrics import ServerMetrics

log = logging.getLogger(__name__)


class RequestError(Exception):
    """A request the pipeline rejected; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param


class RequestResult(messages.RequestOutput, kw_only=True):
    """Everything a finished (or failed) request produced, with its stage timestamps."""

    received: float
    text: str = ""

    def add(self, item: messages.TextItem) -> None:
        self.text += item.text
        self.token_ids.extend(item.token_ids)
        self.token_times.extend(item.token_times)
        if item.prompt_tokens:
            self.prompt_tokens = item.prompt_tokens
            self.cached_tokens = item.cached_tokens
        self.tokenized = self.tokenized or item.tokenized
        self.first_scheduled = self.first_scheduled or item.first_scheduled
        if item.finish_reason is not None:
            self.finish_reason = item.finish_reason
            self.finished = item.finished or time.time()

    def meta_info(self) -> dict[str, object]:
        first_token = self.token_times[0] if self.token_times else None
        return {
            "id": self.rid,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": len(self.token_ids),
            "cached_tokens": self.cached_tokens,
            "finish_reason": {"type": self.finish_reason} if self.finish_reason else None,
            "received": self.received,
            "tokenized": self.tokenized,
            "first_scheduled": self.first_scheduled,
            "first_token": first_token,
            "token_times": self.token_times,
            "finished": self.finished,
            "ttft": first_token - self.received if first_token else None,
            "e2e_latency": self.finished - self.received if self.finished else None,
        }


class RequestStream:
    """The outputs of one request, in order; closing it early aborts the request."""

    def __init__(self, frontend: Frontend, rid: str, received: float) -> None:
        self.frontend = frontend
        self.rid = rid
        self.queue: asyncio.Queue[messages.TextItem] = asyncio.Queue()
        self.result = RequestResult(rid=rid, received=received)
        self.done = False
        self.last_token_time: float | None = None  # for ITL, as items arrive

    async def next(self) -> messages.TextItem:
        """The next item; raises ``RequestError`` if the pipeline rejected the request."""
        item = await self.queue.get()
        if item.error is not None:
            self.done = True
            self.frontend.forget(self.rid)
            raise RequestError(item.error, item.error_status)
        self.result.add(item)
        if item.finish_reason is not None:
            self.done = True
            self.frontend.forget(self.rid)
        return item

    async def collect(self) -> RequestResult:
        """Wait for the end of the request; everything it produced."""
        while not self.done:
            await self.next()
        return self.result

    def close(self) -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self.done:
            self.done = True
            self.frontend.abort(self.rid)


class Frontend:
    def __init__(self, cfg: ServeConfig, metrics: ServerMetrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.streams: dict[str, RequestStream] = {}
        self.worker_of: dict[str, int] = {}
        self.stats: messages.StatsUpdate | None = None
        self._next_worker = itertools.cycle(range(cfg.num_tokenizers))
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._to_tokenizers: list[zmq.Socket[bytes]] = []
        self._inbox: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        for i in range(self.cfg.num_tokenizers):
            sock = self._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self.cfg.tokenizer_addr(i))
            self._to_tokenizers.append(sock)
        inbox = self._actx.socket(zmq.PULL)
        inbox.setsockopt(zmq.LINGER, 0)
        inbox.bind(self.cfg.frontend_addr)
        self._inbox = inbox
        self._task = asyncio.create_task(self._receive_loop(inbox), name="frontend-inbox")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for sock in self._to_tokenizers:
            sock.close()
        if self._inbox is not None:
            self._inbox.close()
        self._ctx.term()
        self._actx.term()

    def submit(self, req: messages.GenerateRequest) -> RequestStream:
        """Send ``req`` into the pipeline; its outputs arrive on the returned stream."""
        stream = RequestStream(self, req.rid, req.received)
        self.streams[req.rid] = stream
        worker = next(self._next_worker)
        self.worker_of[req.rid] = worker
        self._to_tokenizers[worker].send(messages.encode(req))
        log.debug("rid %s sent to tokenizer %d", req.rid, worker)
        return stream

    def abort(self, rid: str) -> None:
        worker = self.worker_of.get(rid)
        self.forget(rid)
        if worker is None:
            return
        log.info("rid %s aborted by the client", rid)
        self.metrics.on_aborted()
        self._to_tokenizers[worker].send(messages.encode(messages.AbortRequest(rid=rid)))

    def end_all(self, reason: str = "abort") -> None:
        """Finish every open request now (server shutdown) and abort it in the scheduler."""
        for rid, stream in list(self.streams.items()):
            stream.queue.put_nowait(messages.TextItem(rid=rid, text="", finish_reason=reason))
            worker = self.worker_of.get(rid)
            if worker is not None:
                self._to_tokenizers[worker].send(
                    messages.encode(messages.AbortRequest(rid=rid, reason="server shutdown"))
                )
        if self.streams:
            log.info("ended %d open requests for shutdown", len(self.streams))

    def forget(self, rid: str) -> None:
        self.streams.pop(rid, None)
        self.worker_of.pop(rid, None)

    async def _receive_loop(self, inbox: zmq.asyncio.Socket) -> None:
        while True:
            msg = messages.try_decode(await inbox.recv())
            if isinstance(msg, messages.TextBatch):
                for item in msg.items:
                    stream = self.streams.get(item.rid)
                    if stream is not None:
                        stream.last_token_time = self.metrics.on_item(
                            stream.result.received, stream.last_token_time, item
                        )
                        stream.queue.put_nowait(item)
            elif isinstance(msg, messages.StatsUpdate):
                self.stats = msg
                self.metrics.on_stats(msg)
            elif msg is not None:
                log.error("unexpected message %s", type(msg).__name__)
