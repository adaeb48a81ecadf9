"""Moving KV pages between engine processes over ZeroMQ: the transport of prefill/decode
disaggregation, on one host (``ipc://``) or across hosts (``tcp://``).

The decode side reserves its pages and names them; the prefill side pushes (SGLang's
order). The order of calls, each scheduler loop calling ``poll`` between its steps::

    decode scheduler                                   prefill scheduler
    reserve pages D; receiver.expect(tid, D)
    -- tid, len(D), receiver.address (control plane) -> prefill the prompt into pages P
                                                       sender.send(address, tid, pool, P, n)
    receiver.poll(): header + pages arrive  <--------- (frames leave on ZeroMQ's I/O thread)
      checked, scattered into D, acknowledged -------> sender.poll() -> TransferResult ok:
    -> TransferResult ok: schedule the request           free P (failed: P are still valid)

Pushing after the decode side reserved means the prefill side holds its pages only until
the acknowledgment, with no lease to expire; the price is that decode pages are reserved
for the length of a prefill.

Threading: no thread of ours. ``KVSender.send`` gathers the pages into one host tensor on
the caller's thread (one copy; on an accelerator a device gather plus a synchronous copy
into pinned host memory), hands it to ZeroMQ without a copy and returns; ZeroMQ's I/O
thread moves the bytes. ``KVSender.poll`` and ``KVReceiver.poll`` never block unless asked
to (``timeout_s``), so a scheduler loop calls them between steps; the receiver's poll does
the checks and the scatter (one copy, plus one up to the device on an accelerator) on the
caller's thread. Neither object is thread-safe: use each from one thread.

Failure:

- Every transfer the sender starts ends exactly once in its ``poll``: ``ok``, ``refused``,
  ``mismatch`` or ``timeout`` (no acknowledgment within ``timeout_s``: a dead, silent or
  slow peer). Each transfer has its own connection, closed when the transfer ends, so a
  timed-out transfer's frames are dropped with it and never reach a peer that comes back;
  the cost is a connect per transfer (a TCP handshake; nothing next to megabytes of pages).
- A failure on the sender means "not acknowledged": if the acknowledgment itself was lost
  the pages may have landed. The control plane cancels the decode side's expectation.
- A receiver refuses (and writes nothing for) a transfer with no expectation: one that was
  cancelled (``cancel``: the request was aborted) or one that arrives before its ``expect``.
  With decode reserving first, an early arrival is a broken protocol, not a race, so it is
  refused at once rather than held. A transfer whose header does not match the pool or the
  expectation is refused as ``mismatch`` and ends the expectation.

Two paths for the bytes. When the receiver says it runs on the sender's GPU (``send``'s
``peer_device``, the receiver's ``device``), the pages stay in the sender's pool and the
receiver copies them out device to device through CUDA IPC (``engine.kvcache.cuda_ipc``),
acknowledging once its copy has completed (a later ``poll``); a ``cancel`` while that copy
runs waits for it, so no page is written after its request let it go. Otherwise they go
through host memory, as above (between GPUs, or hosts; RDMA is a future path).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import zmq

from engine.kvcache.cuda_ipc import PoolOpener, PoolShare, device_uuid
from engine.kvcache.pool import KVPool
from engine.kvcache.transfer_wire import (
    CudaSource,
    Status,
    TransferAck,
    TransferHeader,
    TransferResult,
    check_pages,
    decode_ack,
    decode_header,
    encode,
    gather,
    header_for,
    mismatch,
    scatter,
    wire_view,
)

log = logging.getLogger(__name__)

CANCELLED_KEPT = 4096  # cancelled ids remembered, to name the reason a late arrival is refused


@dataclass(slots=True)
class _Outgoing:
    peer: str
    sock: zmq.Socket[bytes]
    pages: int
    nbytes: int
    n_tokens: int
    began: float
    deadline: float
    data: torch.Tensor | torch.cuda.Event  # the staged pages, or the IPC event: alive till the end

    def result(self, ack: TransferAck, seconds: float) -> TransferResult:
        ipc = not isinstance(self.data, torch.Tensor)
        return TransferResult(
            ack.transfer_id, ack.status, self.pages, self.nbytes, seconds, self.n_tokens,
            ack.detail, ipc,
        )  # fmt: skip


@dataclass(slots=True)
class _Landing:
    """A CUDA IPC copy in flight on the receiver, acknowledged once ``landed`` completes."""

    identity: zmq.Frame
    header: TransferHeader
    pages: int
    began: float
    landed: torch.cuda.Event

    def result(self, now: float) -> TransferResult:
        h, seconds = self.header, now - self.began
        return TransferResult(
            h.transfer_id, "ok", self.pages, h.nbytes, seconds, h.n_tokens, cuda_ipc=True
        )


class KVSender:
    """Pushes pages of the caller's pool to receivers; each transfer must be acknowledged
    within ``timeout_s`` of its ``send``."""

    def __init__(self, timeout_s: float = 10.0) -> None:
        self.timeout_s = timeout_s
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._pending: dict[str, _Outgoing] = {}
        self._share: PoolShare | None = None  # the pool shared through CUDA IPC, once
        self._ipc_failed = False

    def send(
        self,
        peer_address: str,
        transfer_id: str,
        pool: KVPool,
        page_ids: Sequence[int],
        n_tokens: int | None = None,
        peer_device: str = "",
    ) -> None:
        """Start sending pages ``page_ids`` of ``pool`` (in this order) as ``transfer_id``;
        returns once they are gathered (or shared) and queued. ``n_tokens``: the tokens they
        hold (default: full pages); ``peer_device``: the receiver's GPU (its ``device``), for
        CUDA IPC when it is this pool's. Its end comes out of ``poll``."""
        if transfer_id in self._pending:
            raise ValueError(f"transfer {transfer_id} is already in flight")
        check_pages(pool, page_ids)
        began = time.perf_counter()
        data: torch.Tensor | torch.cuda.Event
        shared = self._shared(pool, page_ids, peer_device)
        if shared is not None:
            source, data = shared
            header = header_for(transfer_id, pool, len(page_ids), n_tokens, source)
            frame: memoryview | bytes = b""
        else:
            header = header_for(transfer_id, pool, len(page_ids), n_tokens)
            data = gather(pool, page_ids)
            frame = wire_view(data)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:  # a fresh socket's queue has room: the send only queues, it never waits
            sock.connect(peer_address)
            sock.send_multipart([encode(header), frame], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # a malformed address
            sock.close(linger=0)
            raise
        self._pending[transfer_id] = _Outgoing(
            peer_address,
            sock,
            len(page_ids),
            header.nbytes,
            header.n_tokens,
            began,
            began + self.timeout_s,
            data,
        )

    def _shared(
        self, pool: KVPool, page_ids: Sequence[int], peer_device: str
    ) -> tuple[CudaSource, torch.cuda.Event] | None:
        """The pages shared through CUDA IPC when the peer is on this pool's GPU; None for the
        host path (another device, or CUDA IPC failed here once: logged, then never tried)."""
        if not peer_device or peer_device != device_uuid(pool.device) or self._ipc_failed:
            return None
        try:
            if self._share is None or self._share.pool is not pool:
                self._share = PoolShare(pool)
            return self._share.source(page_ids)
        except RuntimeError as exc:
            log.warning("CUDA IPC unavailable (%s): KV goes through host memory", exc)
            self._ipc_failed = True
            return None

    def in_flight(self) -> int:
        """Transfers sent and not yet ended."""
        return len(self._pending)

    def poll(self, timeout_s: float = 0.0) -> list[TransferResult]:
        """The transfers that ended since the last call: acknowledged (ok or not) or timed
        out. Waits up to ``timeout_s`` for the first while transfers are in flight."""
        wait_until = time.perf_counter() + timeout_s
        while True:
            results = self._collect()
            now = time.perf_counter()
            if results or not self._pending or now >= wait_until:
                return results
            deadline = min(wait_until, *(o.deadline for o in self._pending.values()))
            poller = zmq.Poller()
            for out in self._pending.values():
                poller.register(out.sock, zmq.POLLIN)
            poller.poll(max(1, math.ceil((deadline - now) * 1000)))

    def close(self) -> None:
        """Close every connection, dropping the transfers in flight."""
        for out in self._pending.values():
            out.sock.close(linger=0)
        self._pending.clear()
        self._ctx.term()

    def __enter__(self) -> KVSender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _collect(self) -> list[TransferResult]:
        results = []
        now = time.perf_counter()
        for transfer_id, out in list(self._pending.items()):
            ack = _ack(out.sock, transfer_id)
            if ack is None and now < out.deadline:
                continue
            del self._pending[transfer_id]
            out.sock.close(linger=0)
            if ack is None:
                why = f"no acknowledgment from {out.peer} within {self.timeout_s:g} s"
                ack = TransferAck(transfer_id, "timeout", why)
            if ack.status != "ok":
                log.warning(
                    "transfer %s to %s: %s: %s", transfer_id, out.peer, ack.status, ack.detail
                )
            results.append(out.result(ack, now - out.began))
        return results


def _ack(sock: zmq.Socket[bytes], transfer_id: str) -> TransferAck | None:
    """The acknowledgment waiting on ``sock``, if any (one for another id or undecodable
    bytes are logged and dropped)."""
    try:
        data = sock.recv(zmq.NOBLOCK)
    except zmq.Again:
        return None
    ack = decode_ack(data)
    if ack is None or ack.transfer_id != transfer_id:
        log.error("dropped a bad acknowledgment for transfer %s: %r", transfer_id, data[:80])
        return None
    return ack


class KVReceiver:
    """Receives pages into ``pool`` at the pages each transfer's ``expect`` reserved; bound
    at ``address`` (``tcp://HOST:*`` picks a port: ``self.address`` is the bound one)."""

    def __init__(self, address: str, pool: KVPool) -> None:
        self.pool = pool
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self.address: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._expected: dict[str, list[int]] = {}
        self._cancelled: dict[str, None] = {}  # insertion-ordered: the oldest first
        self.refused = 0  # transfers refused without an expectation to end (for metrics)
        self.device = device_uuid(pool.device)  # senders on this GPU use CUDA IPC
        self._opener = PoolOpener(pool)
        self._landing: dict[str, _Landing] = {}  # CUDA IPC copies in flight

    def expect(self, transfer_id: str, page_ids: Sequence[int]) -> None:
        """Reserve ``page_ids`` of the pool (the caller allocated them) for ``transfer_id``,
        whose pages land there in the order the sender names its own."""
        if transfer_id in self._expected:
            raise ValueError(f"transfer {transfer_id} is already expected")
        check_pages(self.pool, page_ids)
        self._expected[transfer_id] = list(page_ids)
        self._cancelled.pop(transfer_id, None)

    def cancel(self, transfer_id: str) -> bool:
        """Stop expecting ``transfer_id`` (its request was aborted): if it still arrives it
        is refused and writes nothing; if its CUDA IPC copy is running, it waits for the
        copy and refuses it. False when it was not expected (or already ended)."""
        landing = self._landing.pop(transfer_id, None)
        if landing is not None:
            landing.landed.synchronize()
            self._reply(landing.identity, TransferAck(transfer_id, "refused", "cancelled"))
        elif self._expected.pop(transfer_id, None) is None:
            return False
        self._cancelled[transfer_id] = None
        if len(self._cancelled) > CANCELLED_KEPT:
            del self._cancelled[next(iter(self._cancelled))]
        return True

    def poll(self) -> list[TransferResult]:
        """Handle every transfer that has arrived, without waiting: the ends of expected
        transfers (landed, or mismatched and so ended); refusals are logged only."""
        results: list[TransferResult] = []
        while True:
            try:
                frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            result = self._handle(frames)
            if result is not None:
                results.append(result)
        for transfer_id, landing in list(self._landing.items()):
            if landing.landed.query():  # type: ignore[no-untyped-call]
                del self._landing[transfer_id]
                self._reply(landing.identity, TransferAck(transfer_id, "ok"))
                results.append(landing.result(time.perf_counter()))
        return results

    def close(self) -> None:
        for landing in self._landing.values():  # no copy may outlive the receiver
            landing.landed.synchronize()
        self._landing.clear()
        self._sock.close(linger=0)
        self._ctx.term()

    def __enter__(self) -> KVReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handle(self, frames: list[zmq.Frame]) -> TransferResult | None:
        began = time.perf_counter()
        identity, *parts = frames
        header = decode_header(parts[0].bytes) if len(parts) == 2 else None
        if header is None:
            self.refused += 1
            self._reply(identity, TransferAck("", "refused", "malformed transfer message"))
            log.error("refused a malformed transfer message (%d frames)", len(frames))
            return None
        transfer_id = header.transfer_id
        pages = self._expected.pop(transfer_id, None)
        if pages is None:
            self.refused += 1
            why = "was cancelled" if transfer_id in self._cancelled else "is not expected"
            self._reply(identity, TransferAck(transfer_id, "refused", f"transfer {why}"))
            log.warning("refused transfer %s: it %s", transfer_id, why)
            return None
        status: Status = "ok"
        problem = mismatch(header, self.pool, len(pages), len(parts[1]))
        if not problem and header.source is not None:
            problem = self._opener.mismatch(header.source)
        if problem:
            status = "mismatch"
            log.warning("refused transfer %s: %s", transfer_id, problem)
        elif header.source is not None:
            try:
                landed = self._opener.pull(header.source, pages)
            except RuntimeError as exc:  # the sender's pool cannot be opened here
                problem = f"CUDA IPC failed ({exc}); serve with --no-pd-cuda-ipc"
                status = "mismatch"
                log.error("refused transfer %s: %s", transfer_id, problem)
            else:
                self._landing[transfer_id] = _Landing(identity, header, len(pages), began, landed)
                return None
        else:
            scatter(self.pool, pages, parts[1].buffer)
        self._reply(identity, TransferAck(transfer_id, status, problem))
        seconds = time.perf_counter() - began
        return TransferResult(
            transfer_id, status, len(pages), header.nbytes, seconds, header.n_tokens, problem
        )

    def _reply(self, identity: zmq.Frame, ack: TransferAck) -> None:
        self._sock.send_multipart([identity, encode(ack)], flags=zmq.NOBLOCK)
