"""Host arrays to the device: one pinned buffer, one asynchronous copy per step.

Arrays are packed at 8-byte aligned offsets into a pinned byte buffer, copied
with one non-blocking host-to-device copy, and viewed back on the device with
their dtypes. The buffer is reused step after step: ``upload`` first waits for
the event recorded after the previous copy out of it, so the host never
overwrites bytes that the device has not read yet (with overlap scheduling the
host prepares step N+1 while the device still runs step N). On CPU the arrays
are wrapped without a copy.
"""

from __future__ import annotations

from collections.abc import Sequence

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
        offsets, total = _layout(arrays)
        self.wait()
        assert self._host is not None
        if total > self._host.numel():
            self._host = torch.empty(2 * total, dtype=torch.uint8, pin_memory=True)
        host = self._host.numpy()
        for a, off in zip(arrays, offsets, strict=True):
            host[off : off + a.nbytes] = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        dev = self._host[:total].to(self.device, non_blocking=True)
        self.record()
        return [
            dev[off : off + a.nbytes].view(_torch_dtype(a.dtype)).view(a.shape)
            for a, off in zip(arrays, offsets, strict=True)
        ]

    def record(self) -> None:
        """Mark the point after which the pinned buffer may be rewritten (after its copies)."""
        if self.on_cuda:
            self._event = recorded_event()

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()


def _layout(arrays: Sequence[np.ndarray]) -> tuple[list[int], int]:
    offsets = []
    total = 0
    for a in arrays:
        offsets.append(total)
        total += -(-a.nbytes // ALIGN) * ALIGN
    return offsets, max(total, ALIGN)


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
        raise TypeError(f"cannot stage arrays of dtype {dtype}") from None
