"""The page tables of live requests, kept on the device and written incrementally.

One row per request slot::

    pages[slot, j] = KV page holding positions [j * page_size, (j + 1) * page_size)

A request gets a slot the first time a step names it and keeps it until it is
released (it ended, was aborted or preempted). Each step compares the plan's page
tuple of every request with the tuple it last wrote: by identity first (the
scheduler core hands out the same tuple while a request's pages are unchanged),
then by content, and writes only what changed: the new tail when pages were
appended, the whole row when pages were replaced (a prefix switched to the
cache's copy). Page ids are checked against the pool when they are written.
When every slot is taken, the least recently used request that the step does not
name loses its slot (it gets a fresh one, rewritten, if it comes back).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch


class RequestTable:
    def __init__(self, capacity: int, max_pages: int, num_pages: int, device: torch.device) -> None:
        if capacity < 1 or max_pages < 1:
            raise ValueError(f"need capacity and max_pages >= 1, got {capacity}, {max_pages}")
        self.capacity = capacity
        self.max_pages = max_pages
        self.num_pages = num_pages
        self.pages = torch.zeros((capacity, max_pages), dtype=torch.int32, device=device)
        self._slot: dict[str, int] = {}
        self._written: dict[str, tuple[int, ...]] = {}
        self._used: dict[str, int] = {}
        self._free = list(range(capacity - 1, -1, -1))
        self._step = 0

    def __contains__(self, rid: str) -> bool:
        return rid in self._slot

    def release(self, rids: Iterable[str]) -> None:
        for rid in rids:
            slot = self._slot.pop(rid, None)
            if slot is not None:
                self._free.append(slot)
                del self._written[rid], self._used[rid]

    def assign(
        self, rids: Sequence[str], pages: Sequence[tuple[int, ...]]
    ) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Slots of ``rids`` (int32) and the writes ``(rows, cols, page ids)`` that bring
        their rows up to date; raises ``ValueError`` (changing nothing) on a bad page table.
        """
        changes = self._changes(rids, pages)
        self._step += 1
        named = set(rids)
        rows: list[int] = []
        cols: list[int] = []
        vals: list[int] = []
        for rid, new, first in changes:
            slot = self._slot.get(rid)
            if slot is None:
                slot = self._take_slot(named)
                self._slot[rid] = slot
            rows.extend([slot] * (len(new) - first))
            cols.extend(range(first, len(new)))
            vals.extend(new[first:])
            self._written[rid] = new
        slots = np.empty(len(rids), dtype=np.int32)
        for i, rid in enumerate(rids):
            slots[i] = self._slot[rid]
            self._used[rid] = self._step
        writes = (
            np.asarray(rows, dtype=np.int64),
            np.asarray(cols, dtype=np.int64),
            np.asarray(vals, dtype=np.int32),
        )
        return slots, writes

    def apply(self, rows: torch.Tensor, cols: torch.Tensor, vals: torch.Tensor) -> None:
        """Apply writes from ``assign`` (as device tensors), in stream order."""
        if rows.numel():
            self.pages.index_put_((rows, cols), vals)

    def _changes(
        self, rids: Sequence[str], pages: Sequence[tuple[int, ...]]
    ) -> list[tuple[str, tuple[int, ...], int]]:
        """(rid, pages, first column to write) of every row that needs writing; validates."""
        out = []
        for rid, new in zip(rids, pages, strict=True):
            old = self._written.get(rid) if rid in self._slot else None
            if old is new:
                continue
            if old is not None and len(new) >= len(old) and new[: len(old)] == old:
                first = len(old)
                if first == len(new):
                    self._written[rid] = new
                    continue
            else:
                first = 0
            if len(new) > self.max_pages:
                raise ValueError(
                    f"request {rid}: {len(new)} pages exceed the table's "
                    f"{self.max_pages} per request"
                )
            bad = [p for p in new[first:] if not 0 <= p < self.num_pages]
            if bad:
                raise ValueError(
                    f"request {rid}: page ids {bad[:8]} outside the pool of {self.num_pages} pages"
                )
            out.append((rid, new, first))
        return out

    def _take_slot(self, named: set[str]) -> int:
        if self._free:
            return self._free.pop()
        idle = [rid for rid in self._slot if rid not in named]
        if not idle:
            raise RuntimeError(f"a step names more than {self.capacity} requests")
        victim = min(idle, key=self._used.__getitem__)
        slot = self._slot.pop(victim)
        del self._written[victim], self._used[victim]
        return slot
