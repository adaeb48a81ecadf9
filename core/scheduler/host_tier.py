"""The host KV tier: host slots for prefix cache pages, and the copies the next plan carries.

A *host slot* holds one page of KV in host memory (the same layout as a
device page). The radix cache (``core.scheduler.radix``) decides residency:
each node's pages are on the device, on the host, or both. This module owns
the slots (its own allocator, so the tier has its own capacity) and queues the
copies the cache decides, which the scheduler moves into the next plan
(``Plan.writes``, ``Plan.loads``; their order is the engine's contract, see
``core.scheduler.plan``)::

    write: device page -> host slot   (write_back: on device eviction;
                                       write_through: on entering the cache)
    load:  host slot -> device page   (a match that reaches host-only pages)

A slot freed while a write into it is still queued drops that write, so no two
queued writes target one slot. Counters are in pages: what plans carried.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.scheduler.pages import PageAllocator

Copy = tuple[int, int]  # (source, destination): (page, slot) for a write, (slot, page) for a load


class HostTier:
    """Host slots ``0 .. num_slots-1`` and the copies queued for the next plan."""

    def __init__(self, num_slots: int, page_size: int, write_through: bool) -> None:
        self.slots = PageAllocator(num_slots, page_size)
        self.write_through = write_through
        self._writes: list[Copy] = []
        self._loads: list[Copy] = []
        self.loaded_pages = 0
        self.written_pages = 0

    @property
    def num_slots(self) -> int:
        return self.slots.num_pages

    @property
    def num_free(self) -> int:
        return self.slots.num_free

    @property
    def copies_pending(self) -> bool:
        """Whether copies wait for the next plan."""
        return bool(self._writes or self._loads)

    def alloc(self, n: int) -> list[int]:
        return self.slots.alloc(n)

    def free(self, slots: Sequence[int]) -> None:
        """Free ``slots``, dropping the queued writes into them."""
        gone = set(slots)
        if self._writes and gone:
            self._writes = [w for w in self._writes if w[1] not in gone]
        self.slots.free(slots)

    def write(self, pages: Sequence[int], slots: Sequence[int]) -> None:
        self._writes.extend(zip(pages, slots, strict=True))

    def load(self, slots: Sequence[int], pages: Sequence[int]) -> None:
        self._loads.extend(zip(slots, pages, strict=True))

    def take_copies(self) -> tuple[tuple[Copy, ...], tuple[Copy, ...]]:
        """The queued (writes, loads), in the order they were decided; the queue empties."""
        writes, loads = tuple(self._writes), tuple(self._loads)
        self._writes, self._loads = [], []
        self.written_pages += len(writes)
        self.loaded_pages += len(loads)
        return writes, loads

    def pending_writes(self) -> list[Copy]:
        """The queued writes (for invariant checks)."""
        return list(self._writes)
