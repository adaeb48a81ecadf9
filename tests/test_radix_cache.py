"""Unit tests of the radix prefix cache: match, split, insert, eviction order."""

from __future__ import annotations

import pytest

from core.scheduler import PageAllocator, RadixCache


def make(num_pages: int = 32) -> tuple[PageAllocator, RadixCache]:
    alloc = PageAllocator(num_pages, page_size=4)
    return alloc, RadixCache(alloc)


def insert(cache: RadixCache, alloc: PageAllocator, keys: list[str], tick: int = 0) -> list[int]:
    pages = alloc.alloc(len(keys))
    rejected = cache.insert(keys, pages, tick)
    alloc.free(rejected)
    return pages


def test_match_returns_longest_cached_prefix() -> None:
    alloc, cache = make()
    pages = insert(cache, alloc, ["a", "b", "c"])
    got, node = cache.match(["a", "b", "c", "d"], tick=1)
    assert got == pages
    assert node.keys == ["a", "b", "c"]
    assert cache.match(["x"], tick=1)[0] == []
    assert cache.match_length(["a", "b", "z"]) == 2


def test_partial_match_splits_the_edge() -> None:
    alloc, cache = make()
    pages = insert(cache, alloc, ["a", "b", "c", "d"])
    got, node = cache.match(["a", "b", "x"], tick=1)
    assert got == pages[:2]
    assert node.keys == ["a", "b"] and node.pages == pages[:2]
    (child,) = node.children.values()
    assert child.keys == ["c", "d"] and child.pages == pages[2:]
    assert cache.cached_pages == 4


def test_insert_keeps_existing_pages_and_returns_duplicates() -> None:
    alloc, cache = make()
    first = insert(cache, alloc, ["a", "b"])
    second = alloc.alloc(3)
    rejected = cache.insert(["a", "b", "c"], second, tick=1)
    assert rejected == second[:2], "pages for keys already cached are handed back"
    got, _ = cache.match(["a", "b", "c"], tick=2)
    assert got == [*first, second[2]]
    # a caller re-inserting pages it matched from the cache gets nothing back
    assert cache.insert(["a", "b", "c"], got, tick=3) == []


def test_diverging_insert_creates_a_branch() -> None:
    alloc, cache = make()
    insert(cache, alloc, ["a", "b", "c"])
    insert(cache, alloc, ["a", "b", "x", "y"])
    assert cache.match_length(["a", "b", "c"]) == 3
    assert cache.match_length(["a", "b", "x", "y"]) == 4
    assert cache.cached_pages == 5
    (upper,) = cache.root.children.values()
    assert upper.keys == ["a", "b"] and set(upper.children) == {"c", "x"}


def test_evicts_least_recently_used_leaves_first() -> None:
    alloc, cache = make(num_pages=8)
    old = insert(cache, alloc, ["o1", "o2"], tick=1)
    new = insert(cache, alloc, ["n1", "n2"], tick=2)
    cache.match(["o1", "o2"], tick=3)  # touch: "n" is now the least recent
    free_before = alloc.num_free
    assert cache.evict(1) == 2  # whole leaf
    assert alloc.num_free == free_before + 2
    assert set(alloc.free_pages()) >= set(new)
    assert cache.match_length(["o1", "o2"]) == 2
    assert cache.match_length(["n1"]) == 0
    assert set(old).isdisjoint(alloc.free_pages())


def test_locked_nodes_are_never_evicted_and_parents_follow_children() -> None:
    alloc, cache = make(num_pages=8)
    insert(cache, alloc, ["a", "b"], tick=1)
    insert(cache, alloc, ["a", "c"], tick=2)
    _, node = cache.match(["a", "b"], tick=3)
    cache.lock(node)
    assert cache.evictable_pages == 1  # only "c"
    assert cache.evict(10) == 1
    assert cache.match_length(["a", "b"]) == 2
    cache.unlock(node)
    assert cache.evictable_pages == 2
    assert cache.evict(10) == 2  # leaf "b", then its now childless parent "a"
    assert cache.cached_pages == 0 and alloc.num_free == 8


def test_split_keeps_reference_counts() -> None:
    alloc, cache = make()
    insert(cache, alloc, ["a", "b", "c"])
    _, node = cache.match(["a", "b", "c"], tick=1)
    cache.lock(node)
    cache.match(["a", "x"], tick=2)  # splits the locked edge after "a"
    (upper,) = cache.root.children.values()
    assert upper.keys == ["a"] and upper.ref == 1
    assert cache.evictable_pages == 0
    cache.unlock(node)
    assert upper.ref == 0 and cache.evictable_pages == 3


def test_allocator_rejects_overdraw() -> None:
    alloc = PageAllocator(2, page_size=4)
    alloc.alloc(2)
    with pytest.raises(RuntimeError):
        alloc.alloc(1)
    with pytest.raises(ValueError):
        PageAllocator(0, page_size=4)


def test_evictable_leaves_follow_inserts_locks_and_evictions() -> None:
    alloc, cache = make()

    def leaves() -> set[tuple[str, ...]]:
        expected = {n for n in cache.nodes() if not n.children and n.ref == 0}
        assert cache.evictable_leaves == expected
        return {tuple(n.keys) for n in expected}

    insert(cache, alloc, ["a", "b"], tick=1)
    assert leaves() == {("a", "b")}
    insert(cache, alloc, ["a", "b", "c"], tick=2)  # extends the unlocked leaf
    assert leaves() == {("c",)}
    insert(cache, alloc, ["a", "x"], tick=3)  # splits "a b" and adds a sibling branch
    assert leaves() == {("c",), ("x",)}
    _, node = cache.match(["a", "b", "c"], tick=4)
    cache.lock(node)
    assert leaves() == {("x",)}
    cache.unlock(node)
    assert leaves() == {("c",), ("x",)}
    cache.evict(1)  # "x" is older than "c", which the match touched
    assert leaves() == {("c",)}
    cache.evict(1)  # then "c", and its parent "b" becomes a leaf
    assert leaves() == {("b",)}
