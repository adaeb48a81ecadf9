"""Host arrays to the device: one pinned buffer, one asynchronous copy per step.

Arrays are grouped by dtype: each dtype's arrays lie back to back, flattened in
input order, in one region of a pinned byte buffer (``Region``; regions start
8-byte aligned, in the order their dtypes first appear). One non-blocking
host-to-device copy moves the buffer; on the device each region is viewed with
its dtype once and split into its arrays (``split_with_sizes``, which skips the
Python layers of ``torch.split``), so a step of many small arrays costs a few
torch calls per dtype rather than a few per array. The buffer is reused step
after step: ``upload`` first waits for the event recorded after the previous
copy out of it, so the host never overwrites bytes that the device has not read
yet (with overlap scheduling the host prepares step N+1 while the device still
runs step N). On CPU the arrays are wrapped without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch

from engine.runner.step import recorded_event

ALIGN = 8


class Staging:
    def __init__(self, device: torch.device, capacity: int = 1 << 20) -> None:
        self.device = device
        self.on_cuda = device.type == "cuda"
        self._host: torch.Tensor | None = None
        self._event: torch.cuda.Event | None = None
        if self.on_cuda:
            self._host = torch.empty(capacity, dtype=torch.uint8, pin_memory=True)

    def upload(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """Device tensors holding ``arrays`` (same shapes and dtypes), in order."""
        if not self.on_cuda:
            return [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        regions, total = layout(arrays)
        self.wait()
        assert self._host is not None
        if total > self._host.numel():
            self._host = torch.empty(2 * total, dtype=torch.uint8, pin_memory=True)
        pack(arrays, regions, self._host.numpy())
        dev = self._host[:total].to(self.device, non_blocking=True)
        self.record()
        views: dict[int, torch.Tensor] = {}
        for r in regions:
            typed = dev[r.start : r.start + r.nbytes].view(r.torch_dtype)
            for i, t in zip(r.members, typed.split_with_sizes(r.sizes), strict=True):
                views[i] = t if arrays[i].ndim == 1 else t.view(arrays[i].shape)
        return [views[i] for i in range(len(arrays))]

    def record(self) -> None:
        """Mark the point after which the pinned buffer may be rewritten (after its copies)."""
        if self.on_cuda:
            self._event = recorded_event()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()


class Region(NamedTuple):
    """The arrays of one dtype in the staging buffer: bytes ``[start, start + nbytes)``
    hold input arrays ``members`` (in input order), flattened, of ``sizes`` elements."""

    dtype: np.dtype
    torch_dtype: torch.dtype
    start: int
    nbytes: int
    members: list[int]
    sizes: list[int]


def layout(arrays: Sequence[np.ndarray]) -> tuple[list[Region], int]:
    """One region per dtype of ``arrays``, each starting ``ALIGN``-aligned, and the bytes
    they span (at least ``ALIGN``). Raises TypeError for a dtype that cannot be staged."""
    groups: dict[np.dtype, list[int]] = {}
    for i, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(i)
    regions: list[Region] = []
    total = 0
    for dtype, members in groups.items():
        sizes = [arrays[i].size for i in members]
        nbytes = sum(sizes) * dtype.itemsize
        regions.append(Region(dtype, _torch_dtype(dtype), total, nbytes, members, sizes))
        total += -(-nbytes // ALIGN) * ALIGN
    return regions, max(total, ALIGN)


def pack(arrays: Sequence[np.ndarray], regions: Sequence[Region], buf: np.ndarray) -> None:
    """Write ``arrays`` into the uint8 buffer ``buf`` as ``regions`` lay them out."""
    for r in regions:
        if r.nbytes:
            out = buf[r.start : r.start + r.nbytes].view(r.dtype)
            np.concatenate([arrays[i] for i in r.members], axis=None, out=out)


_DTYPES = {
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(np.float32): torch.float32,
    np.dtype(np.bool_): torch.bool,
}


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    try:
        return _DTYPES[dtype]
    except KeyError:
        staged = ", ".join(str(d) for d in _DTYPES)
        raise TypeError(f"cannot stage arrays of dtype {dtype} (staged: {staged})") from None
