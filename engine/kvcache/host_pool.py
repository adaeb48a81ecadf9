"""The host KV tier's memory: host slots in the device pool's page layout, and the copies.

A slot holds one page of every layer's K and V, contiguous::

    slots: [num_slots, 2 * num_layers, page_size, num_kv_heads_local, head_dim]

(layers' K first, then their V), pinned on CUDA so that copies run
asynchronously, plain on CPU. ``run`` performs a plan's copies as the
scheduler core's contract says (``core.scheduler.plan``): its writes (device
page -> host slot), then its loads (host slot -> device page), before the
step's compute. Each direction is a few large copies: the device side is one
gather (``index_select``) or scatter (``index_copy_``) by page index per layer,
the host side one copy per run of consecutive slots.

On CUDA the copies go on a side stream that the compute stream waits for (an
event) before the step's forward, so they overlap the step in flight. The side
stream waits for nothing: the pages a plan's copies touch are never used by a
plan still running (the core's contract). Nor does the host wait for the side
stream: the page indices go up from pinned memory without a synchronising copy
(``torch.tensor(..., device=cuda)`` would wait for the side stream's earlier
copies, holding the host for the whole load while the step before it could be
finished), so ``run`` returns once the copies are queued. On CPU the same code
runs synchronously.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import torch

from engine.kvcache.pool import KVPool


class HostKVPool:
    def __init__(self, device_pool: KVPool, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a host KV pool needs slots, got {num_slots}")
        self.device = device_pool.device
        self.layers = [*device_pool.k, *device_pool.v]
        page = (device_pool.page_size, device_pool.num_kv_heads, device_pool.head_dim)
        self.page_shape = (len(self.layers), *page)
        cuda = self.device.type == "cuda"
        self.slots = torch.empty(
            (num_slots, *self.page_shape), dtype=device_pool.dtype, pin_memory=cuda
        )
        self.stream = torch.cuda.Stream(self.device) if cuda else None  # type: ignore[no-untyped-call]
        self.page_size = device_pool.page_size
        self.loaded_tokens = 0
        self.written_tokens = 0
        self._load_s = 0.0
        self._load_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def run(self, writes: Sequence[tuple[int, int]], loads: Sequence[tuple[int, int]]) -> None:
        """Copy ``writes`` (page, slot), then ``loads`` (slot, page), before the next compute."""
        if self.stream is None:
            self._write(writes)
            began = time.perf_counter()
            self._load(loads)
            self._load_s += time.perf_counter() - began if loads else 0.0
            return
        with torch.cuda.stream(self.stream):
            self._write(writes)
            if loads:
                start = _event()
                self._load(loads)
                self._load_events.append((start, _event()))
            done = _event()
        torch.cuda.current_stream(self.device).wait_event(done)

    def load_seconds(self) -> float:
        """Time spent loading so far (loads still running on the device not yet counted)."""
        events = self._load_events
        while events and events[0][1].query():  # type: ignore[no-untyped-call]
            start, end = events.pop(0)
            self._load_s += start.elapsed_time(end) / 1e3
        return self._load_s

    def _write(self, writes: Sequence[tuple[int, int]]) -> None:
        if not writes:
            return
        pages = device_ints([p for p, _ in writes], self.device)
        staged = torch.stack([layer.index_select(0, pages) for layer in self.layers], dim=1)
        for lo, hi, first in _runs([s for _, s in writes]):
            self.slots[first : first + hi - lo].copy_(staged[lo:hi], non_blocking=True)
        self.written_tokens += len(writes) * self.page_size

    def _load(self, loads: Sequence[tuple[int, int]]) -> None:
        if not loads:
            return
        staged = torch.empty(
            (len(loads), *self.page_shape), dtype=self.slots.dtype, device=self.device
        )
        for lo, hi, first in _runs([s for s, _ in loads]):
            staged[lo:hi].copy_(self.slots[first : first + hi - lo], non_blocking=True)
        pages = device_ints([p for _, p in loads], self.device)
        for i, layer in enumerate(self.layers):
            layer.index_copy_(0, pages, staged[:, i])
        self.loaded_tokens += len(loads) * self.page_size


def _event() -> torch.cuda.Event:
    event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    event.record()
    return event


def _runs(slots: Sequence[int]) -> Iterator[tuple[int, int, int]]:
    """Runs of consecutive slots: (start index, end index, first slot) each."""
    start = 0
    for i in range(1, len(slots) + 1):
        if i == len(slots) or slots[i] != slots[i - 1] + 1:
            yield start, i, slots[start]
            start = i


def device_ints(values: Sequence[int], device: torch.device) -> torch.Tensor:
    """``values`` as an int64 tensor on ``device``, queued without waiting for the stream.

    ``torch.tensor(values, device=cuda)`` copies from pageable memory, which first waits for
    everything queued on the stream: with overlap scheduling, for the step in flight, so the
    host would launch the next step only once the device is idle. From pinned memory the
    copy is queued and the call returns (the caching host allocator keeps the buffer until
    the copy is done).
    """
    host = torch.tensor(values, dtype=torch.int64)
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)
