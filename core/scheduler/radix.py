"""Radix prefix cache over page keys, holding KV pages by integer id.

Every edge of the tree is a run of *page keys* (one key per full page of
tokens: a tuple of token ids, or ``block_hash * pages_per_block + index``) with the page
id that holds each key's KV. Matching and insertion work on whole pages.

Invariants (checked by ``core.scheduler.invariants``):

    node.ref        = number of live requests whose locked prefix passes through node
    evictable_pages = sum of len(node.pages) over nodes with ref == 0 (root excluded)
    cached_pages    = sum of len(node.pages) over all nodes
    evictable_leaves = the nodes without children with ref == 0
    only leaves with ref == 0 are evicted, least recently used first
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence

from core.scheduler.pages import PageAllocator

PageKey = Hashable  # a tuple of token ids, or an int from a trace's block hash


class RadixNode:
    __slots__ = ("children", "id", "keys", "last_access", "pages", "parent", "ref")

    def __init__(
        self,
        keys: list[PageKey],
        pages: list[int],
        parent: RadixNode | None,
        node_id: int,
        last_access: int,
    ) -> None:
        self.keys = keys
        self.pages = pages
        self.parent = parent
        self.children: dict[PageKey, RadixNode] = {}
        self.ref = 0
        self.id = node_id
        self.last_access = last_access


class RadixCache:
    """Prefix cache whose evicted pages go back to ``allocator``.

    ``tick`` values passed in order accesses for LRU; they are logical (the
    scheduler's step counter), never a clock.
    """

    def __init__(self, allocator: PageAllocator) -> None:
        self.allocator = allocator
        self._next_id = 1
        self.root = RadixNode([], [], None, 0, 0)
        self.root.ref = 1  # the root is never evicted
        self.cached_pages = 0
        self.evictable_pages = 0
        self.evictable_leaves: set[RadixNode] = set()  # leaves with ref == 0: eviction candidates

    # ------------------------------------------------------------------ lookup
    def match(self, keys: Sequence[PageKey], tick: int) -> tuple[list[int], RadixNode]:
        """Pages of the longest cached prefix of ``keys`` and the node where it ends.

        A partially matched edge is split so that the returned node covers the
        prefix exactly and can be locked.
        """
        pages, _, _, node = self._walk(keys, tick)
        return pages, node

    def match_length(self, keys: Sequence[PageKey]) -> int:
        """Number of leading pages of ``keys`` that are cached (read-only)."""
        return self._walk(keys, None)[1]

    def probe(self, keys: Sequence[PageKey]) -> tuple[int, int]:
        """Read-only match: (cached leading pages, of those, pages now evictable).

        The second figure is what locking the match would take out of
        ``evictable_pages``.
        """
        _, matched, evictable, _ = self._walk(keys, None)
        return matched, evictable

    def _walk(
        self, keys: Sequence[PageKey], tick: int | None
    ) -> tuple[list[int], int, int, RadixNode]:
        """Follow ``keys`` down the tree: (pages, matched, evictable matched, last node).

        With a ``tick`` the walk touches the nodes it passes, splits a partial
        edge and collects the pages; without one it only reads.
        """
        node = self.root
        pages: list[int] = []
        i = evictable = 0
        n = len(keys)
        while i < n:
            child = node.children.get(keys[i])
            if child is None:
                break
            common = _common_prefix(child.keys, keys, i)
            i += common
            if child.ref == 0:
                evictable += common
            if common < len(child.keys):
                if tick is None:
                    break
                child = self._split(child, common)
            if tick is not None:
                child.last_access = tick
                pages.extend(child.pages)
            node = child
        return pages, i, evictable, node

    # ------------------------------------------------------------------ locks
    def lock(self, node: RadixNode) -> None:
        while node is not self.root:
            if node.ref == 0:
                self.evictable_pages -= len(node.pages)
                self.evictable_leaves.discard(node)
            node.ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: RadixNode) -> None:
        while node is not self.root:
            node.ref -= 1
            if node.ref == 0:
                self.evictable_pages += len(node.pages)
                if not node.children:
                    self.evictable_leaves.add(node)
            assert node.parent is not None
            node = node.parent

    # ------------------------------------------------------------------ insert
    def insert(self, keys: Sequence[PageKey], pages: Sequence[int], tick: int) -> list[int]:
        """Adopt ``pages[i]`` as the KV of ``keys[i]``; return the pages not adopted.

        Where the tree already holds a key, it keeps its own page; the caller's
        page for that key is returned unless it is the very same page (a page
        the caller had matched from the cache).
        """
        assert len(keys) == len(pages)
        cached, node = self.match(keys, tick)
        n = len(cached)
        rejected: list[int] = []
        if cached != list(pages[:n]):
            rejected = [theirs for own, theirs in zip(cached, pages, strict=False) if own != theirs]
        if n < len(keys):
            new = RadixNode(list(keys[n:]), list(pages[n:]), node, self._next_id, tick)
            self._next_id += 1
            node.children[keys[n]] = new
            self.evictable_leaves.discard(node)
            self.evictable_leaves.add(new)
            self.cached_pages += len(new.pages)
            self.evictable_pages += len(new.pages)
        return rejected

    # ------------------------------------------------------------------ evict
    def evict(self, num_pages: int) -> int:
        """Free at least ``num_pages`` pages from unreferenced leaves, LRU first.

        Returns how many pages were freed (less than asked if not enough are
        evictable). Whole nodes are evicted.
        """
        if num_pages <= 0 or self.evictable_pages == 0:
            return 0
        heap = [(n.last_access, n.id, n) for n in self.evictable_leaves]
        heapq.heapify(heap)
        freed = 0
        while freed < num_pages and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.keys[0]]
            self.evictable_leaves.remove(leaf)
            self.allocator.free(leaf.pages)
            freed += len(leaf.pages)
            self.cached_pages -= len(leaf.pages)
            self.evictable_pages -= len(leaf.pages)
            if parent is not self.root and not parent.children and parent.ref == 0:
                self.evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    # ------------------------------------------------------------------ helpers
    def _split(self, child: RadixNode, at: int) -> RadixNode:
        """Cut ``child``'s edge after ``at`` keys; return the new upper node."""
        parent = child.parent
        assert parent is not None and 0 < at < len(child.keys)
        upper = RadixNode(
            child.keys[:at], child.pages[:at], parent, self._next_id, child.last_access
        )
        self._next_id += 1
        upper.ref = child.ref
        parent.children[child.keys[0]] = upper
        child.keys = child.keys[at:]
        child.pages = child.pages[at:]
        child.parent = upper
        upper.children[child.keys[0]] = child
        return upper

    def nodes(self) -> Iterator[RadixNode]:
        """All nodes except the root, parents before children."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())


def _common_prefix(edge: list[PageKey], keys: Sequence[PageKey], start: int) -> int:
    limit = min(len(edge), len(keys) - start)
    if edge[:limit] == list(keys[start : start + limit]):
        return limit  # the common case, compared at C speed
    lo, hi = 0, limit - 1  # the first mismatch lies in [lo, hi]; halve on slice equality
    while lo < hi:
        mid = (lo + hi) // 2
        if edge[lo : mid + 1] == list(keys[start + lo : start + mid + 1]):
            lo = mid + 1
        else:
            hi = mid
    return lo
