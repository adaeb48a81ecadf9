"""The frontend's side of the pipeline: submit requests, route their outputs back by rid.

One ``Frontend`` per server process. ``submit`` places a request on a replica
(``Replicas``: the router core, told of every request's end), sends it into
the pipeline through the inlet of the layout (``engine.server.inlets``: a
tokenizer worker, the replica's scheduler, or this process's tokenizer thread)
and returns a ``RequestStream``; a background task reads ``TextBatch`` messages
(with ``--layout frontend``, ``TokenBatch`` messages it detokenizes) and puts
each item on the queue of its rid. Aborts take the path of their request, so
they arrive after it. When a replica fails, its open requests fail with 503
and the others keep serving.

Admission: a request is *queued* from ``submit`` until its first output item
arrives (it is being tokenized, waits in the scheduler, or is in prefill).
With ``max_queued`` set, ``admit`` refuses a new request (429, ``Retry-After``)
while that many are queued. With ``request_timeout`` set, a request that has
not finished that many seconds after it was received is aborted and fails
with 504.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Mapping

import zmq
import zmq.asyncio

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.server.errors import APIError
from engine.server.inlets import FrontendText, Inlet, PipelineFull, make_inlet
from engine.server.metrics import ServerMetrics
from engine.server.replicas import Replicas

log = logging.getLogger(__name__)
RETRY_AFTER_MAX_S = 60
FINISH_WINDOW = 64  # recent finishes that estimate the completion rate for Retry-After


class RequestResult(messages.RequestOutput, kw_only=True):
    """Everything a finished (or failed) request produced, with its stage timestamps."""

    received: float
    replica: int = 0  # the replica the frontend placed it on
    text: str = ""
    pieces: dict[int, bytes] = {}
    prompt_text: str | None = None

    def add(self, item: messages.TextItem) -> None:
        self.text += item.text
        self.token_ids.extend(item.token_ids)
        self.token_times.extend(item.token_times)
        self.logprobs.extend(item.logprobs)
        self.pieces.update(item.pieces)
        if item.prompt_logprobs is not None:
            self.prompt_logprobs = item.prompt_logprobs
            self.prompt_text = item.prompt_text
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
            "replica": self.replica,
            "ttft": first_token - self.received if first_token else None,
            "e2e_latency": self.finished - self.received if self.finished else None,
        }


class RequestStream:
    """The outputs of one request, in order; closing it early aborts the request."""

    def __init__(
        self, frontend: Frontend, rid: str, received: float, timeout: float | None
    ) -> None:
        self.frontend = frontend
        self.rid = rid
        self.queue: asyncio.Queue[messages.TextItem] = asyncio.Queue()
        self.result = RequestResult(rid=rid, received=received)
        self.done = False
        self.started = False  # an output item arrived: the request no longer counts as queued
        self.last_token_time: float | None = None  # for ITL, as items arrive
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    async def next(self) -> messages.TextItem:
        """The next item; raises ``APIError`` if the request failed or timed out."""
        if self.deadline is None:
            item = await self.queue.get()
        else:
            try:
                item = await asyncio.wait_for(
                    self.queue.get(), max(0.0, self.deadline - time.monotonic())
                )
            except TimeoutError:
                self.close("request timeout")
                self.frontend.metrics.on_timeout()
                raise APIError(
                    f"the request did not finish within {self.timeout:g} s (--request-timeout)",
                    504,
                    code="timeout",
                ) from None
        if item.error is not None:
            self.done = True
            self.frontend.forget(self.rid, finished=False)
            raise APIError(item.error, item.error_status)
        self.result.add(item)
        if item.finish_reason is not None:
            self.done = True
            self.frontend.forget(self.rid, finished=True)
            self.frontend.metrics.on_finished(self.result.received, self.result)
        return item

    async def collect(self) -> RequestResult:
        """Wait for the end of the request; everything it produced."""
        while not self.done:
            await self.next()
        return self.result

    def close(self, reason: str = "client disconnected") -> None:
        """Abort the request unless it already finished (idempotent)."""
        if not self.done:
            self.done = True
            self.frontend.abort(self.rid, reason)


class Frontend:
    """The pipeline as the routes see it: admit, submit, abort, and fail everything at shutdown."""

    def __init__(
        self, cfg: ServeConfig, metrics: ServerMetrics, pools: Mapping[int, tuple[int, int]]
    ) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.streams: dict[str, RequestStream] = {}
        self.worker_of: dict[str, int] = {}
        self.replicas = Replicas(cfg.router, cfg.dp_size)
        self.finish_times: deque[float] = deque(maxlen=FINISH_WINDOW)
        self._ctx = zmq.Context()
        self._actx = zmq.asyncio.Context()
        self._inlet: Inlet | None = None
        self._inbox: zmq.asyncio.Socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        metrics.track_open(lambda: len(self.streams))
        metrics.track_replicas(self.replicas, pools)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inlet = make_inlet(self.cfg, self._ctx, self._deliver)
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
        if self._inlet is not None:
            self._inlet.close()
        if self._inbox is not None:
            self._inbox.close()
        self._ctx.term()
        self._actx.term()

    def num_queued(self) -> int:
        """Requests submitted that have not produced their first output yet."""
        return sum(1 for s in self.streams.values() if not s.started)

    def retry_after(self, waiting: int) -> int:
        """Seconds until ``waiting`` requests have likely finished, from the recent finish rate."""
        times = self.finish_times
        if len(times) < 2 or times[-1] <= times[0]:
            return 1
        rate = (len(times) - 1) / (times[-1] - times[0])
        return max(1, min(RETRY_AFTER_MAX_S, math.ceil(waiting / rate)))

    def admit(self) -> None:
        """Raise 429 (with ``Retry-After``) when ``max_queued`` requests are already queued."""
        limit = self.cfg.max_queued
        if limit is None:
            return
        queued = self.num_queued()
        if queued >= limit:
            self.metrics.on_rejected("queue_full")
            raise APIError(
                f"the server is overloaded: {queued} requests are queued (--max-queued {limit})",
                status=429,
                code="queue_full",
                retry_after=self.retry_after(queued),
            )

    def submit(self, req: messages.GenerateRequest) -> RequestStream:
        """Place ``req`` on a replica and send it into the pipeline; its outputs arrive on the
        returned stream."""
        assert self._inlet is not None, "submit before start"
        req.replica = self.replicas.place(req)
        try:
            worker = self._inlet.send(req)
        except PipelineFull as exc:
            self.replicas.ended(req.rid, finished=False)
            self.metrics.on_rejected("pipeline_full")
            raise APIError(
                f"{exc} is not keeping up; retry later",
                status=503,
                code="pipeline_full",
                retry_after=1,
            ) from None
        stream = RequestStream(self, req.rid, req.received, self.cfg.request_timeout)
        stream.result.replica = req.replica
        self.streams[req.rid] = stream
        self.worker_of[req.rid] = worker
        log.debug("rid %s sent on for replica %d (path %d)", req.rid, req.replica, worker)
        return stream

    def abort(self, rid: str, reason: str = "client disconnected") -> None:
        sent = rid in self.worker_of
        self._send_abort(rid, reason)
        self.forget(rid, finished=False)
        if not sent:
            return
        log.info("rid %s aborted: %s", rid, reason)
        if reason == "client disconnected":
            self.metrics.on_aborted()

    def _send_abort(self, rid: str, reason: str) -> None:
        """Tell ``rid``'s scheduler (by its request's path) to drop it, unless it is not open or
        its replica is down. Best effort: a stage that is gone or stuck does not block the
        frontend."""
        worker, replica = self.worker_of.get(rid), self.replicas.replica_of(rid)
        if worker is None or replica is None or self._inlet is None:
            return
        self._inlet.abort(worker, messages.AbortRequest(rid=rid, reason=reason, replica=replica))

    def end_all(self, reason: str) -> None:
        """Fail every open request with 503 ``reason`` (the server is stopping); abort each."""
        for rid, stream in list(self.streams.items()):
            self._fail(stream, reason)
            self._send_abort(rid, "server shutdown")
        if self.streams:
            log.info("failed %d open requests: %s", len(self.streams), reason)

    def replica_failed(self, replica: int, reason: str) -> None:
        """Take ``replica`` out of the rotation and fail its open requests with 503."""
        rids = self.replicas.fail(replica, reason)
        for rid in rids:
            stream = self.streams.get(rid)
            if stream is not None:
                self._fail(stream, f"replica {replica} is down: {reason}")
        if isinstance(self._inlet, FrontendText):
            self._inlet.forget(rids)  # the dead scheduler sends no final items
        log.error(
            "replica %d is down (%s); failed its %d open requests", replica, reason, len(rids)
        )

    def replica_failed_threadsafe(self, replica: int, reason: str) -> None:
        """``replica_failed`` from another thread (the launcher's watcher)."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self.replica_failed, replica, reason)

    @staticmethod
    def _fail(stream: RequestStream, reason: str) -> None:
        stream.queue.put_nowait(
            messages.TextItem(rid=stream.rid, text="", error=reason, error_status=503)
        )

    def forget(self, rid: str, finished: bool) -> None:
        """``rid`` ended (finished, or not); the router learns of it."""
        self.streams.pop(rid, None)
        self.worker_of.pop(rid, None)
        self.replicas.ended(rid, finished)

    def _deliver(self, items: list[messages.TextItem]) -> None:
        """Put each item on the queue of its request's stream."""
        for item in items:
            if item.finish_reason is not None or item.error is not None:
                self.finish_times.append(time.monotonic())
            stream = self.streams.get(item.rid)
            if stream is not None:
                stream.started = True
                stream.last_token_time = self.metrics.on_item(
                    stream.result.received, stream.last_token_time, item
                )
                stream.queue.put_nowait(item)

    async def _receive_loop(self, inbox: zmq.asyncio.Socket) -> None:
        while True:
            msg = messages.try_decode(await inbox.recv())
            if isinstance(msg, messages.TextBatch):
                self._deliver(msg.items)
            elif isinstance(msg, messages.TokenBatch) and isinstance(self._inlet, FrontendText):
                items, stopped = await self._inlet.detokenize(msg)
                for rid in stopped:
                    log.info("rid %s matched a stop string; aborting it", rid)
                    self._send_abort(rid, "stop string")
                self._deliver(items)
            elif isinstance(msg, messages.StatsUpdate):
                self.metrics.on_stats(msg)
            elif msg is not None:
                log.error("unexpected message %s", type(msg).__name__)
