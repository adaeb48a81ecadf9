"""KV pages between two processes on one GPU through CUDA IPC: a device-to-device copy, no
host hop (``engine.kvcache.transfer`` takes this path when both ends name the same GPU).

The sender shares its pool once (``PoolShare``: a CUDA IPC memory handle per layer's K and
V, made once and kept for the pool's life) and, per transfer, an interprocess CUDA event
recorded after the work that wrote the pages, with its page ids (``CudaSource``, in the
transfer's header). The receiver opens the sender's pool once (``PoolOpener``, cached by
the share's id), makes a side stream wait on the event, and copies the pages from the
sender's pool into its own on that stream (per layer's K and V one gather and one scatter);
it acknowledges once the copy's own event has completed, so the sender holds its pages
until they have been read, as on the host path.

Both ends must run on one GPU (the header names it by UUID; a receiver on another refuses
the transfer as a mismatch). The sender's pool outlives every transfer it shares, so the
handles stay valid while the sender runs; a receiver keeps at most ``OPENED_KEPT`` senders'
pools open (a restarted sender shares under a new id). The copy reads the sender's pages
when it runs, not when they were sent, so the sender must hold them until acknowledged, as
the hand-off does: the receiver's wait for them starts before the sender's (both servers'
``--pd-timeout`` alike) and a transfer that arrives after it ended is refused unread.
"""

from __future__ import annotations

import uuid
from collections import OrderedDict
from collections.abc import Sequence

import torch
from torch.multiprocessing.reductions import rebuild_cuda_tensor, reduce_tensor

from engine.kvcache.host_pool import device_ints
from engine.kvcache.pool import KVPool
from engine.kvcache.transfer_wire import CudaSource, IpcTensor

OPENED_KEPT = 8  # senders' pools a receiver keeps open


def device_uuid(device: torch.device) -> str:
    """The UUID of ``device``'s GPU; empty for a device that is not a CUDA GPU."""
    if device.type != "cuda":
        return ""
    return str(torch.cuda.get_device_properties(device).uuid)


def _layers(pool: KVPool) -> list[torch.Tensor]:
    return [*pool.k, *pool.v]


class PoolShare:
    """The sender's side: its pool's layers shared once, an event per transfer."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.share_id = uuid.uuid4().hex
        self.uuid = device_uuid(pool.device)
        self.layers = [_ipc_tensor(t) for t in _layers(pool)]

    def source(self, page_ids: Sequence[int]) -> tuple[CudaSource, torch.cuda.Event]:
        """The header's part of a transfer of ``page_ids``, and its event (keep it alive until
        the transfer ends)."""
        event = torch.cuda.Event(interprocess=True)  # type: ignore[no-untyped-call]
        event.record(torch.cuda.current_stream(self.pool.device))
        handle = event.ipc_handle()  # type: ignore[no-untyped-call]
        return CudaSource(self.uuid, self.share_id, self.layers, list(page_ids), handle), event


def _ipc_tensor(t: torch.Tensor) -> IpcTensor:
    _, args = reduce_tensor(t)  # type: ignore[no-untyped-call]
    (_, size, stride, offset, _, _, device, handle, nbytes, byte_offset, _, ref_handle,
     ref_offset, event_handle, event_sync) = args  # fmt: skip
    return IpcTensor(
        list(size), list(stride), offset, device, handle, nbytes, byte_offset, ref_handle,
        ref_offset, event_handle or b"", bool(event_sync),
    )  # fmt: skip


class PoolOpener:
    """The receiver's side: senders' pools opened once, pages pulled into ``pool``."""

    def __init__(self, pool: KVPool) -> None:
        self.pool = pool
        self.uuid = device_uuid(pool.device)
        self.stream = torch.cuda.Stream(pool.device) if self.uuid else None  # type: ignore[no-untyped-call]
        self._opened: OrderedDict[str, list[torch.Tensor]] = OrderedDict()

    def mismatch(self, source: CudaSource) -> str:
        """Why this receiver cannot pull from ``source``; empty when it can: as many layer
        tensors as its pool, each pages of its pool's page shape, the pages among theirs, and
        one GPU (so that no copy it starts can read out of bounds)."""
        ours = 2 * len(self.pool.k)
        if len(source.layers) != ours:
            return f"CUDA IPC of {len(source.layers)} layer tensors, the pool has {ours}"
        page = list(self.pool.k[0].shape[1:])
        if any(t.size[1:] != page for t in source.layers):
            return f"CUDA IPC of pages shaped otherwise than this pool's {page}"
        held = min(t.size[0] for t in source.layers)
        if not all(0 <= p < held for p in source.pages):
            return f"CUDA IPC of pages outside the sender's {held}"
        if source.device_uuid != self.uuid:
            here = self.uuid or self.pool.device.type
            return f"CUDA IPC from GPU {source.device_uuid} to {here}: not one GPU"
        return ""

    def pull(self, source: CudaSource, page_ids: Sequence[int]) -> torch.cuda.Event:
        """Start copying ``source``'s pages into ``page_ids`` of the pool (in order); the
        event completes when they have landed."""
        assert self.stream is not None
        device = self.pool.device
        with torch.cuda.stream(self.stream):
            remote = self._open(source)  # a first open waits for the share on this stream
            # from pinned memory, queued: a copy from pageable memory would hold the host
            # until the stream, so the sender's work, is done
            src, dst = device_ints(source.pages, device), device_ints(page_ids, device)
            written = torch.cuda.Event.from_ipc_handle(device, source.event)  # type: ignore[no-untyped-call]
            self.stream.wait_event(written)
            for local, theirs in zip(_layers(self.pool), remote, strict=True):
                local.index_copy_(0, dst, theirs.index_select(0, src))
            landed = torch.cuda.Event()  # type: ignore[no-untyped-call]
            landed.record(self.stream)
        return landed

    def _open(self, source: CudaSource) -> list[torch.Tensor]:
        opened = self._opened.get(source.share_id)
        if opened is None:
            opened = [_rebuild(t, self.pool.dtype) for t in source.layers]
            self._opened[source.share_id] = opened
            if len(self._opened) > OPENED_KEPT:
                self._opened.popitem(last=False)
        self._opened.move_to_end(source.share_id)
        return opened


def _rebuild(t: IpcTensor, dtype: torch.dtype) -> torch.Tensor:
    return rebuild_cuda_tensor(  # type: ignore[no-untyped-call, no-any-return]
        torch.Tensor, torch.Size(t.size), tuple(t.stride), t.offset, torch.UntypedStorage,
        dtype, t.device, t.handle, t.nbytes, t.byte_offset, False, t.ref_counter_handle,
        t.ref_counter_offset, t.event_handle or None, t.event_sync,
    )  # fmt: skip
