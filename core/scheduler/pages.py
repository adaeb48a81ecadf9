"""The KV page allocator: a fixed set of integer page ids, each free or owned."""

from __future__ import annotations

from collections.abc import Sequence


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold ``tokens`` KV positions."""
    return -(-tokens // page_size)


class OutOfPages(RuntimeError):
    """Raised when more pages are asked for than are free."""


class PageAllocator:
    """Hands out page ids ``0 .. num_pages-1``; each page is free or owned by exactly one holder.

    Pages are handed out lowest id first from a LIFO free list, so allocation is
    deterministic for the same sequence of calls.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0:
            raise ValueError(f"num_pages must be positive, got {num_pages}")
        if page_size <= 0:
            raise ValueError(f"page_size must be positive, got {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: list[int] = list(range(num_pages - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def alloc(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        if n <= 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        taken.reverse()
        return taken

    def free(self, pages: Sequence[int]) -> None:
        self._free.extend(reversed(pages))

    def free_pages(self) -> list[int]:
        """A copy of the free list (for invariant checks)."""
        return list(self._free)
