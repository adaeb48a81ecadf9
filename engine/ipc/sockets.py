"""ZeroMQ helpers every child process uses: its sockets, receiving a message, reporting ready.

A leaf module: the workers (tokenizer, detokenizer, scheduler ranks) import it,
and the child entry point (``engine.launch.child``) imports the workers, never
the other way round.
"""

from __future__ import annotations

import os

import zmq

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.ipc.heap import freeze_heap
from engine.ipc.host_profile import serving

SIGNAL_CHECK_MS = 500

Context = zmq.Context[zmq.Socket[bytes]]


def recv_message(sock: zmq.Socket[bytes]) -> messages.Message | None:
    """The next message, or None for bytes that are not one (logged).

    Waits in slices of ``SIGNAL_CHECK_MS``: a SIGTERM the kernel delivers to
    another thread would not interrupt a blocking receive, so the main thread
    returns to Python regularly to run its handler.
    """
    while not sock.poll(SIGNAL_CHECK_MS):
        pass
    return messages.try_decode(sock.recv())


def open_sockets(
    inbox_addr: str, *out_addrs: str
) -> tuple[Context, zmq.Socket[bytes], list[zmq.Socket[bytes]]]:
    """A new context, a PULL socket bound at ``inbox_addr`` and a PUSH to each of ``out_addrs``."""
    ctx: Context = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(inbox_addr)
    outs = []
    for addr in out_addrs:
        sock = ctx.socket(zmq.PUSH)
        sock.connect(addr)
        outs.append(sock)
    return ctx, inbox, outs


def report_ready(cfg: ServeConfig, ctx: Context, role: str, rank: int, **info: object) -> None:
    """Tell the launcher this child is ready to serve, its start-up heap frozen first
    (``cfg.gc_freeze``) and its host profile started (``cfg.host_profile``)."""
    if cfg.gc_freeze:
        freeze_heap()
    serving()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(cfg.ready_addr)
    ready = messages.Ready(role=role, rank=rank, pid=os.getpid(), replica=cfg.replica, info=info)
    sock.send(messages.encode(ready))
    sock.close()
