"""An approximate prefix tree of the keys sent to each worker (SGLang's cache-aware router).

One trie is shared by all workers: a node is one key item, and it records,
per worker ("tenant"), when a key through it was last sent there. The tree
approximates each worker's prefix cache without asking it.

Invariants:

- a node's time for a worker is >= the times of that worker in the node's
  children (a key touches every node on its path with the same ``now``, and
  ``now`` never goes back), so each worker's entries form a prefix-closed
  subtree, and expiring or evicting the oldest first removes leaves first;
- ``size[w]`` is the number of nodes holding ``w`` and stays <= ``max_items``
  after every ``insert``; ``tokens[w]`` is the sum of those nodes' ``tokens``, the
  prompt tokens an item stands for (a key's items differ in unit: a 16-character
  text chunk is about 4 tokens, a token id 1, a trace block its 512), so that two
  trees of other units measure the same prompts alike;
- an entry older than ``ttl`` never counts as a match, swept or not.
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Sequence
from dataclasses import dataclass, field


@dataclass(slots=True, eq=False)
class Node:
    parent: Node | None
    item: Hashable
    depth: int
    tokens: float = 1.0  # the prompt tokens the item stands for
    children: dict[Hashable, Node] = field(default_factory=dict)
    tenants: dict[str, float] = field(default_factory=dict)  # worker -> last use


class PrefixTree:
    def __init__(self, ttl: float, max_items: int) -> None:
        self.ttl = ttl
        self.max_items = max_items
        self.root = Node(None, None, 0)
        self.size: dict[str, int] = {}
        self.tokens: dict[str, float] = {}
        self.now = float("-inf")
        self._next_sweep = float("-inf")

    def match(
        self, key: Sequence[Hashable], workers: Collection[str], now: float
    ) -> dict[str, int]:
        """The length of the longest live prefix of ``key`` held by each of ``workers``."""
        now = self._advance(now)
        never = float("-inf")
        lengths = dict.fromkeys(workers, 0)
        alive = set(workers)
        node = self.root
        for depth, item in enumerate(key, start=1):
            child = node.children.get(item)
            if child is None:
                break
            alive = {w for w in alive if now - child.tenants.get(w, never) < self.ttl}
            if not alive:
                break
            for w in alive:
                lengths[w] = depth
            node = child
        return lengths

    def insert(
        self, key: Sequence[Hashable], worker: str, now: float, item_tokens: float = 1.0
    ) -> None:
        """Record that ``key`` was sent to ``worker`` at ``now``, each new item standing for
        ``item_tokens`` prompt tokens; evict if over the bound."""
        now = self._advance(now)
        if now >= self._next_sweep:
            self.expire(now)
        node = self.root
        for item in key:
            child = node.children.get(item)
            if child is None:
                child = node.children[item] = Node(node, item, node.depth + 1, item_tokens)
            if worker not in child.tenants:
                self.size[worker] = self.size.get(worker, 0) + 1
                self.tokens[worker] = self.tokens.get(worker, 0.0) + child.tokens
            child.tenants[worker] = now
            node = child
        if self.size.get(worker, 0) > self.max_items:
            self._evict(worker, self.max_items - self.max_items // 4)

    def expire(self, now: float) -> None:
        """Drop every entry last used ``ttl`` or more before ``now``."""
        now = self._advance(now)
        for node in self._nodes():
            for w in [w for w, t in node.tenants.items() if now - t >= self.ttl]:
                self._drop(node, w)
        self._next_sweep = now + self.ttl / 2

    def remove_worker(self, worker: str) -> None:
        for node in self._nodes():
            if worker in node.tenants:
                self._drop(node, worker)
        self.size.pop(worker, None)
        self.tokens.pop(worker, None)

    def items(self) -> int:
        """Nodes in the tree (shared prefixes counted once)."""
        return sum(1 for _ in self._nodes())

    def _advance(self, now: float) -> float:
        self.now = max(self.now, now)
        return self.now

    def _evict(self, worker: str, target: int) -> None:
        """Drop ``worker``'s least recently used entries, deepest first, until ``target`` remain."""
        held = [n for n in self._nodes() if worker in n.tenants]
        held.sort(key=lambda n: (n.tenants[worker], -n.depth))
        for node in held[: max(0, len(held) - target)]:
            self._drop(node, worker)

    def _drop(self, node: Node, worker: str) -> None:
        del node.tenants[worker]
        self.size[worker] -= 1
        self.tokens[worker] -= node.tokens
        while node.parent is not None and not node.tenants and not node.children:
            del node.parent.children[node.item]
            node = node.parent

    def _nodes(self) -> list[Node]:
        """Every node but the root, parents before children."""
        out: list[Node] = []
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out
