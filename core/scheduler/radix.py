"""Radix prefix cache over page keys, holding KV pages by integer id.

Every edge of the tree is a run of *page keys* (one key per full page of
tokens: a tuple of token ids, or ``block_hash * pages_per_block + index``) with the page
id that holds each key's KV. Matching and insertion work on whole pages.

With a host tier (``core.scheduler.host_tier``) a node's pages are on the
device (``node.pages``), on the host (``node.host``, host slots), or both; a
list is empty where the node is not. Evicting a node from the device writes
it to the host when it is not there yet and the host has room (after the
host's own LRU eviction of host-only leaves), else drops it with its host-only
subtree. A match that reaches host-only nodes loads them (``load``). Without a
tier every node is on the device and the cache behaves as it always has.

Invariants (checked by ``core.scheduler.invariants``):

    node.ref        = number of live requests whose locked prefix passes through node
    every node is on the device or on the host; a node on the device has its
                      parent on the device (the device part is a top subtree);
                      a node with ref > 0 is on the device
    evictable_pages = sum of len(node.pages) over nodes with ref == 0 (root excluded)
    cached_pages    = sum of len(node.pages) over all nodes (device pages)
    evictable_leaves = the nodes on the device with ref == 0 and no child on the device
    host_leaves     = the nodes only on the host without children
    only evictable leaves are evicted from the device, host leaves from the host,
    least recently used first
"""

from __future__ import annotations

import heapq
from collections.abc import Hashable, Iterator, Sequence

from core.scheduler.host_tier import HostTier
from core.scheduler.pages import PageAllocator

PageKey = Hashable  # a tuple of token ids, or an int from a trace's block hash


class RadixNode:
    __slots__ = ("children", "host", "id", "keys", "last_access", "pages", "parent", "ref")

    def __init__(
        self,
        keys: list[PageKey],
        pages: list[int],
        parent: RadixNode | None,
        node_id: int,
        last_access: int,
    ) -> None:
        self.keys = keys
        self.pages = pages  # device pages; empty when the node is only on the host
        self.host: list[int] = []  # host slots; empty when the node is not on the host
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

    def __init__(self, allocator: PageAllocator, tier: HostTier | None = None) -> None:
        self.allocator = allocator
        self.tier = tier
        self._next_id = 1
        self.root = RadixNode([], [], None, 0, 0)
        self.root.ref = 1  # the root is never evicted
        self.cached_pages = 0
        self.evictable_pages = 0
        self.evictable_leaves: set[RadixNode] = set()  # device eviction candidates
        self.host_leaves: set[RadixNode] = set()  # host eviction candidates

    # ------------------------------------------------------------------ lookup
    def match(self, keys: Sequence[PageKey], tick: int) -> tuple[list[int], RadixNode]:
        """Device pages of the longest cached prefix of ``keys`` and the node where it ends.

        A partially matched edge is split so that the returned node covers the
        prefix exactly and can be locked. The match may end in host-only
        nodes (``host_path``), whose pages are not among those returned.
        """
        path = self._walk(keys, tick)[0]
        pages: list[int] = []
        for node in path:
            pages.extend(node.pages)
        return pages, path[-1] if path else self.root

    def match_length(self, keys: Sequence[PageKey]) -> int:
        """Number of leading pages of ``keys`` that are cached, on either tier (read-only)."""
        return self._walk(keys, None)[1]

    def probe(self, keys: Sequence[PageKey]) -> tuple[int, int]:
        """Read-only match: (leading pages cached on the device, of those, pages now evictable).

        The second figure is what locking the match would take out of
        ``evictable_pages``.
        """
        _, _, on_device, evictable = self._walk(keys, None)
        return on_device, evictable

    def _walk(
        self, keys: Sequence[PageKey], tick: int | None
    ) -> tuple[list[RadixNode], int, int, int]:
        """Follow ``keys`` down the tree: (nodes passed, matched, on the device, evictable).

        With a ``tick`` the walk touches the nodes it passes and splits a partial
        edge; without one it only reads (and lists no nodes).
        """
        node = self.root
        path: list[RadixNode] = []
        i = on_device = evictable = 0
        n = len(keys)
        while i < n:
            child = node.children.get(keys[i])
            if child is None:
                break
            common = _common_prefix(child.keys, keys, i)
            i += common
            if child.pages:
                on_device += common
                if child.ref == 0:
                    evictable += common
            if common < len(child.keys):
                if tick is None:
                    break
                child = self._split(child, common)
            if tick is not None:
                child.last_access = tick
                path.append(child)
            node = child
        return path, i, on_device, evictable

    def host_path(self, node: RadixNode) -> list[RadixNode]:
        """The host-only nodes ending at ``node`` (a match's tail that needs loading), top first."""
        path = []
        while node is not self.root and not node.pages:
            path.append(node)
            assert node.parent is not None
            node = node.parent
        path.reverse()
        return path

    def load(self, nodes: Sequence[RadixNode], pages: Sequence[int]) -> None:
        """Give the locked host-only ``nodes`` (top first) the device ``pages`` and queue their
        loads; the nodes stay on the host too."""
        assert self.tier is not None
        at = 0
        for node in nodes:
            assert node.ref > 0 and not node.pages
            n = len(node.host)
            node.pages = list(pages[at : at + n])
            at += n
            self.tier.load(node.host, node.pages)
            self.cached_pages += n
            self.host_leaves.discard(node)
        assert at == len(pages)

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
                if not _device_children(node):
                    self.evictable_leaves.add(node)
            assert node.parent is not None
            node = node.parent

    # ------------------------------------------------------------------ insert
    def insert(self, keys: Sequence[PageKey], pages: Sequence[int], tick: int) -> list[int]:
        """Adopt ``pages[i]`` as the KV of ``keys[i]``; return the pages not adopted.

        Where the tree already holds a key on the device, it keeps its own page;
        the caller's page for that key is returned unless it is the very same
        page (a page the caller had matched from the cache). A key held only on
        the host adopts the caller's page (no load needed).
        """
        assert len(keys) == len(pages)
        path, n, _, _ = self._walk(keys, tick)
        node = path[-1] if path else self.root
        cached: list[int] = []
        for passed in path:
            if not passed.pages:
                self._adopt(passed, pages[len(cached) : len(cached) + len(passed.keys)])
            cached.extend(passed.pages)
        rejected: list[int] = []
        if cached != list(pages[:n]):
            rejected = [theirs for own, theirs in zip(cached, pages, strict=False) if own != theirs]
        if n < len(keys):
            new = RadixNode(list(keys[n:]), list(pages[n:]), node, self._next_id, tick)
            self._next_id += 1
            node.children[keys[n]] = new
            self.evictable_leaves.discard(node)
            self.host_leaves.discard(node)
            self.evictable_leaves.add(new)
            self.cached_pages += len(new.pages)
            self.evictable_pages += len(new.pages)
            if self.tier is not None and self.tier.write_through:
                self._write(new)
        return rejected

    def _adopt(self, node: RadixNode, pages: Sequence[int]) -> None:
        """A host-only node takes the caller's computed device ``pages``."""
        node.pages = list(pages)
        self.cached_pages += len(pages)
        self.host_leaves.discard(node)
        if node.ref == 0:
            self.evictable_pages += len(pages)
            if not _device_children(node):
                self.evictable_leaves.add(node)
        assert node.parent is not None
        self.evictable_leaves.discard(node.parent)

    # ------------------------------------------------------------------ evict
    def evict(self, num_pages: int) -> int:
        """Free at least ``num_pages`` device pages from evictable leaves, LRU first.

        Returns how many pages were freed (less than asked if not enough are
        evictable). Whole nodes are evicted; with a host tier each goes to the
        host (written there unless it is there already) when the host has room.
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
            self.evictable_leaves.remove(leaf)
            if self.tier is not None and not leaf.host:
                self._write(leaf)
            self.allocator.free(leaf.pages)
            freed += len(leaf.pages)
            self.cached_pages -= len(leaf.pages)
            self.evictable_pages -= len(leaf.pages)
            if leaf.host:
                leaf.pages = []
                if not leaf.children:
                    self.host_leaves.add(leaf)
            else:
                self._remove(leaf)
            if parent is not self.root and parent.ref == 0 and not _device_children(parent):
                self.evictable_leaves.add(parent)
                heapq.heappush(heap, (parent.last_access, parent.id, parent))
        return freed

    def _write(self, node: RadixNode) -> None:
        """Copy ``node``'s device pages to host slots, when the host has (or makes) room."""
        assert self.tier is not None
        n = len(node.pages)
        if self.tier.num_free < n:
            self._evict_host(n - self.tier.num_free)
        if self.tier.num_free >= n:
            node.host = self.tier.alloc(n)
            self.tier.write(node.pages, node.host)

    def _evict_host(self, num_slots: int) -> None:
        """Free at least ``num_slots`` host slots from unreferenced host leaves, LRU first
        (fewer if the host has no more to give)."""
        heap = [(n.last_access, n.id, n) for n in self.host_leaves if n.ref == 0]
        heapq.heapify(heap)
        freed = 0
        while freed < num_slots and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            freed += len(leaf.host)
            self._remove(leaf)
            if parent in self.host_leaves and parent.ref == 0:
                heapq.heappush(heap, (parent.last_access, parent.id, parent))

    def _remove(self, node: RadixNode) -> None:
        """Take ``node`` and its subtree (host-only) out of the tree, freeing their host slots."""
        parent = node.parent
        assert parent is not None
        del parent.children[node.keys[0]]
        stack = [node]
        while stack:
            gone = stack.pop()
            assert gone is node or not gone.pages
            if gone.host:
                assert self.tier is not None
                self.tier.free(gone.host)
            self.host_leaves.discard(gone)
            stack.extend(gone.children.values())
        if parent is not self.root and not parent.pages and not parent.children:
            self.host_leaves.add(parent)

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
        upper.host = child.host[:at]
        child.host = child.host[at:]
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


def _device_children(node: RadixNode) -> bool:
    return any(child.pages for child in node.children.values())


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
