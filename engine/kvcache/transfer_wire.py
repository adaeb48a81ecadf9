"""What both ends of a KV transfer agree on: the messages, the page layout on the wire, the
checks, and the gather and scatter between a pool and that layout (``engine.kvcache.transfer``
moves them).

A transfer is one ZeroMQ multipart message and one reply::

    frame 0   TransferHeader (msgpack)
    frame 1   the pages: [2 * num_layers, num_pages, page_size, num_kv_heads, head_dim]
              of ``dtype``, every layer's K then every layer's V, pages in the order the
              sender named them, raw bytes (``nbytes`` of them, the byte order of the host);
              empty when the header names a ``CudaSource`` (both ends on one GPU: the
              receiver copies the pages out of the sender's pool, ``engine.kvcache.cuda_ipc``)
    reply     TransferAck (msgpack)

Invariants:

- ``nbytes == num_pages * page_bytes(pool)``: a transfer of whole pages, K and V of every
  layer; ``n_tokens`` says how many of their slots hold tokens (the last page may be part
  full, no page is empty).
- A receiver writes into its pool only after the header matched its pool and the
  expectation in every field and the data frame is ``nbytes`` long: a refused or mismatched
  transfer changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import msgspec
import torch

from engine.kvcache.pool import KVPool

Status = Literal["ok", "timeout", "refused", "mismatch"]


class IpcTensor(msgspec.Struct, frozen=True, array_like=True):
    """One layer tensor of a pool shared through CUDA IPC (what
    ``torch.multiprocessing.reductions`` rebuilds it from in another process)."""

    size: list[int]
    stride: list[int]
    offset: int  # elements into its storage
    device: int
    handle: bytes  # the CUDA IPC memory handle of the allocation holding the storage
    nbytes: int  # the storage's bytes
    byte_offset: int  # the storage's offset in that allocation
    ref_counter_handle: bytes
    ref_counter_offset: int
    event_handle: bytes  # empty: none
    event_sync: bool


class CudaSource(msgspec.Struct, frozen=True):
    """Where a transfer's pages are when both ends share a GPU: pages ``pages`` of the
    sender's pool (``layers``: every layer's K then V, shared as ``share_id``), written once
    the interprocess event ``event`` has completed."""

    device_uuid: str
    share_id: str
    layers: list[IpcTensor]
    pages: list[int]
    event: bytes


class TransferHeader(msgspec.Struct, frozen=True):
    transfer_id: str
    num_pages: int
    num_layers: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    n_tokens: int
    nbytes: int
    source: CudaSource | None = None  # None: the pages follow in frame 1


class TransferAck(msgspec.Struct, frozen=True):
    """The receiver's answer: ``ok``, ``refused`` (no expectation: unexpected or cancelled, or
    a malformed message) or ``mismatch`` (the header or the data does not fit), with why."""

    transfer_id: str
    status: Status
    detail: str = ""


@dataclass(frozen=True, slots=True)
class TransferResult:
    """How one transfer ended, as one side saw it: a record for metrics and the step record.

    ``seconds``: on the sender, from ``send`` to the ``poll`` that saw the acknowledgment
    (or the timeout), so gather, wire, the receiver's scatter and the poll interval; on the
    receiver, from picking the message up to the pages written. ``status`` ``timeout``
    exists only on the sender. ``cuda_ipc``: the pages went device to device through CUDA IPC
    (else through host memory).
    """

    transfer_id: str
    status: Status
    pages: int
    nbytes: int
    seconds: float
    n_tokens: int
    detail: str = ""
    cuda_ipc: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def encode(msg: TransferHeader | TransferAck) -> bytes:
    return _encoder.encode(msg)


def decode_header(data: bytes) -> TransferHeader | None:
    """The header in ``data``, or None for bytes that are not one."""
    try:
        return _header_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def decode_ack(data: bytes) -> TransferAck | None:
    """The acknowledgment in ``data``, or None for bytes that are not one."""
    try:
        return _ack_decoder.decode(data)
    except msgspec.DecodeError:
        return None


def page_bytes(pool: KVPool) -> int:
    """Bytes of one page of ``pool`` on the wire: every layer, K and V."""
    return KVPool.bytes_per_page(
        len(pool.k), pool.page_size, pool.num_kv_heads, pool.head_dim, pool.dtype
    )


def check_pages(pool: KVPool, page_ids: Sequence[int]) -> None:
    """Raise ValueError unless ``page_ids`` are distinct pages of ``pool``, at least one."""
    if not page_ids:
        raise ValueError("a transfer needs at least one page")
    if len(set(page_ids)) != len(page_ids):
        raise ValueError(f"page ids repeat: {list(page_ids)}")
    bad = [p for p in page_ids if not 0 <= p < pool.num_pages]
    if bad:
        raise ValueError(f"page ids {bad} are not pages of a pool of {pool.num_pages}")


def header_for(
    transfer_id: str,
    pool: KVPool,
    num_pages: int,
    n_tokens: int | None,
    source: CudaSource | None = None,
) -> TransferHeader:
    """The header of ``num_pages`` pages of ``pool`` holding ``n_tokens`` tokens (default:
    full pages), at ``source`` or in the data frame."""
    if n_tokens is None:
        n_tokens = num_pages * pool.page_size
    if not (num_pages - 1) * pool.page_size < n_tokens <= num_pages * pool.page_size:
        raise ValueError(
            f"{n_tokens} tokens do not fill {num_pages} pages of {pool.page_size} slots"
        )
    return TransferHeader(
        transfer_id=transfer_id,
        num_pages=num_pages,
        num_layers=len(pool.k),
        page_size=pool.page_size,
        num_kv_heads=pool.num_kv_heads,
        head_dim=pool.head_dim,
        dtype=dtype_name(pool.dtype),
        n_tokens=n_tokens,
        nbytes=num_pages * page_bytes(pool),
        source=source,
    )


def mismatch(header: TransferHeader, pool: KVPool, num_pages: int, data_bytes: int) -> str:
    """Why the transfer ``header`` announces (with ``data_bytes`` of data) does not fit
    ``num_pages`` expected pages of ``pool``; empty when it fits."""
    fields = {
        "layers": (header.num_layers, len(pool.k)),
        "page size": (header.page_size, pool.page_size),
        "kv heads": (header.num_kv_heads, pool.num_kv_heads),
        "head dim": (header.head_dim, pool.head_dim),
        "dtype": (header.dtype, dtype_name(pool.dtype)),
        "pages": (header.num_pages, num_pages),
        "bytes": (header.nbytes, num_pages * page_bytes(pool)),
        "data bytes": (data_bytes, 0 if header.source else header.nbytes),
    }
    if header.source is not None:
        fields["source pages"] = (len(header.source.pages), header.num_pages)
    return ", ".join(
        f"{name} {sent} != {ours}" for name, (sent, ours) in fields.items() if sent != ours
    )


def gather(pool: KVPool, page_ids: Sequence[int]) -> torch.Tensor:
    """The pages ``page_ids`` of every layer in the wire layout, one contiguous host tensor.

    One copy on the pool's device (``index_select`` into the staged tensor); on an
    accelerator a second, synchronous one into pinned host memory for the wire.
    """
    layers = [*pool.k, *pool.v]
    index = torch.tensor(page_ids, dtype=torch.int64, device=pool.device)
    shape = (len(layers), len(page_ids), *layers[0].shape[1:])
    staged = torch.empty(shape, dtype=pool.dtype, device=pool.device)
    for i, layer in enumerate(layers):
        torch.index_select(layer, 0, index, out=staged[i])
    if staged.device.type == "cpu":
        return staged
    host = torch.empty(shape, dtype=pool.dtype, pin_memory=True)
    host.copy_(staged)
    return host


def scatter(pool: KVPool, page_ids: Sequence[int], data: memoryview) -> None:
    """Write ``data`` (the wire layout of ``len(page_ids)`` pages, already checked against
    ``pool``) into the pages ``page_ids`` of every layer. Reads ``data`` in place: on an
    accelerator one copy up, then the scatter there."""
    layers = [*pool.k, *pool.v]
    shape = (len(layers), len(page_ids), *layers[0].shape[1:])
    staged = torch.frombuffer(data, dtype=pool.dtype).view(shape).to(pool.device)
    index = torch.tensor(page_ids, dtype=torch.int64, device=pool.device)
    for i, layer in enumerate(layers):
        layer.index_copy_(0, index, staged[i])


def wire_view(data: torch.Tensor) -> memoryview:
    """The bytes of the contiguous host tensor ``data``, without a copy."""
    return data.view(-1).view(torch.uint8).numpy().data


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(TransferHeader)
_ack_decoder = msgspec.msgpack.Decoder(TransferAck)
