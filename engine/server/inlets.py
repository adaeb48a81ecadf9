"""Where the frontend sends requests and aborts, per ``--layout``.

``split``: to a tokenizer worker process (round-robin; an abort to its
request's worker). ``inline``: as text to the scheduler rank 0 of the
request's replica, which tokenizes it. ``frontend``: this process tokenizes
it on a thread (``engine.tokenizer.worker.tokenize``) and sends the token ids
to that scheduler, and detokenizes the schedulers' tokens on another
(``engine.detokenizer.process.Detokenizer``). Every path keeps an abort
behind its request: the same socket, or the same thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import zmq

from engine.detokenizer.process import Detokenizer
from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.tokenizer.prompt import PromptError, load_tokenizer
from engine.tokenizer.worker import tokenize

log = logging.getLogger(__name__)
Deliver = Callable[[list[messages.TextItem]], None]


class PipelineFull(Exception):
    """The first stage of the pipeline (named) takes no more messages now."""


def push_sockets(ctx: zmq.Context[zmq.Socket[bytes]], addrs: list[str]) -> list[zmq.Socket[bytes]]:
    socks = []
    for addr in addrs:
        sock = ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(addr)
        socks.append(sock)
    return socks


class Inlet:
    """Requests and aborts into the pipeline, through one of ``addrs`` (the stage it reaches
    is ``stage``): an abort through the same socket as its request. ``send`` returns the
    socket's index (the abort's path)."""

    stage = "tokenizer"

    def __init__(self, ctx: zmq.Context[zmq.Socket[bytes]], addrs: list[str]) -> None:
        self.socks = push_sockets(ctx, addrs)
        self._next = itertools.cycle(range(len(addrs)))

    def pick(self, req: messages.GenerateRequest) -> int:
        return next(self._next)

    def send(self, req: messages.GenerateRequest) -> int:
        """Send ``req``; ``PipelineFull`` when its stage is not keeping up."""
        index = self.pick(req)
        try:
            self.socks[index].send(messages.encode(req), zmq.NOBLOCK)
        except zmq.Again:
            raise PipelineFull(f"{self.stage} {index}") from None
        return index

    def abort(self, index: int, msg: messages.AbortRequest) -> None:
        """Best effort: a stage that is gone or stuck does not block the frontend."""
        with contextlib.suppress(zmq.Again):
            self.socks[index].send(messages.encode(msg), zmq.NOBLOCK)

    def close(self) -> None:
        for sock in self.socks:
            sock.close()


class SchedulerInlet(Inlet):
    """``inline``: each request to the scheduler rank 0 of its replica."""

    stage = "the scheduler of replica"

    def pick(self, req: messages.GenerateRequest) -> int:
        return req.replica


class FrontendText(SchedulerInlet):
    """``frontend``: one thread tokenizes each request and sends it (or an abort) to its
    replica's scheduler in the order given; one thread detokenizes the tokens back.

    Only the tokenizer thread touches the sockets (ZeroMQ sockets are not thread-safe).
    A prompt that cannot be served is answered through ``deliver`` on the event loop.
    """

    def __init__(
        self, cfg: ServeConfig, ctx: zmq.Context[zmq.Socket[bytes]], deliver: Deliver
    ) -> None:
        super().__init__(ctx, [cfg.scheduler_addr_of(r) for r in range(cfg.dp_size)])
        self.cfg = cfg
        self.deliver = deliver
        self.loop = asyncio.get_running_loop()
        self.tokenizer = load_tokenizer(cfg.tokenizer_path)
        # a tokenizer of its own: a Rust tokenizer may refuse a call while another thread's runs
        self.detokenizer = Detokenizer(load_tokenizer(cfg.tokenizer_path))
        self.tokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="tokenizer")
        self.detokenize_thread = ThreadPoolExecutor(1, thread_name_prefix="detokenizer")

    def send(self, req: messages.GenerateRequest) -> int:
        self.tokenize_thread.submit(self._tokenize, req)
        return req.replica

    def abort(self, index: int, msg: messages.AbortRequest) -> None:
        self.tokenize_thread.submit(super().abort, index, msg)

    def _tokenize(self, req: messages.GenerateRequest) -> None:
        try:
            out = tokenize(self.tokenizer, req, self.cfg)
        except PromptError as exc:
            log.info("rid %s rejected: %s", req.rid, exc)
            self.fail(req.rid, str(exc), 400)
            return
        log.debug("rid %s tokenized: %d tokens", req.rid, len(out.input_ids))
        try:
            self.socks[req.replica].send(messages.encode(out), zmq.NOBLOCK)
        except zmq.Again:
            self.fail(req.rid, f"{self.stage} {req.replica} is not keeping up; retry later", 503)

    def fail(self, rid: str, error: str, status: int) -> None:
        """Answer ``rid`` with ``error`` (from the tokenizer thread)."""
        item = messages.TextItem(rid=rid, text="", error=error, error_status=status)
        self.loop.call_soon_threadsafe(self.deliver, [item])

    async def detokenize(
        self, batch: messages.TokenBatch
    ) -> tuple[list[messages.TextItem], list[str]]:
        """The text of ``batch``, and the rids whose stop string matched (to abort)."""
        return await self.loop.run_in_executor(
            self.detokenize_thread, self.detokenizer.process, batch
        )

    def forget(self, rids: list[str]) -> None:
        """``rids`` ended without a final item (their replica died): drop their text state."""
        self.detokenize_thread.submit(self.detokenizer.forget, rids)

    def close(self) -> None:
        self.tokenize_thread.shutdown(wait=True, cancel_futures=True)
        self.detokenize_thread.shutdown(wait=True, cancel_futures=True)
        super().close()


def make_inlet(cfg: ServeConfig, ctx: zmq.Context[zmq.Socket[bytes]], deliver: Deliver) -> Inlet:
    """The inlet of ``cfg.layout`` (``frontend`` needs a running event loop)."""
    if cfg.layout == "frontend":
        return FrontendText(cfg, ctx, deliver)
    if cfg.layout == "inline":
        return SchedulerInlet(ctx, [cfg.scheduler_addr_of(r) for r in range(cfg.dp_size)])
    return Inlet(ctx, [cfg.tokenizer_addr(i) for i in range(cfg.num_tokenizers)])
