"""KV memory of the running requests: the page allocator plus the radix prefix cache.

A request's page table is ``Request.pages``; its first ``num_shared_pages``
pages belong to the radix cache, which the request keeps locked through
``cache_node``; the rest are its own. Pages a request gives up leave it as a
``HeldPages`` value, which ``give_back`` applies: computed full pages enter
the cache, the rest are freed, the lock is dropped. The scheduler applies it
at once, or when the plan in flight that still uses those pages completes.

With a host tier, admission's match may end in pages held only on the host:
the request gets fresh device pages for them, their loads are queued for the
plan being made, and they count as cached (``host_hit_pages``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from core.scheduler.config import SchedulerConfig
from core.scheduler.host_tier import Copy, HostTier
from core.scheduler.pages import PageAllocator, pages_for
from core.scheduler.radix import PageKey, RadixCache, RadixNode
from core.scheduler.request import Request


@dataclass(frozen=True, slots=True)
class HeldPages:
    """Pages taken from a request: ``pages[:len(keys)]`` are computed full pages with those
    keys (they go to the prefix cache), the others are freed; ``node`` is unlocked."""

    keys: Sequence[PageKey]
    pages: Sequence[int]
    node: RadixNode | None = None
    num_shared: int = 0  # leading pages that the cache owns already

    @property
    def num_private(self) -> int:
        """Pages that become free or evictable once given back."""
        return len(self.pages) - self.num_shared


class KVMemory:
    """Page allocation for requests: admission fills, decode growth, prefix sharing, release."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.page_size = ps = config.page_size
        self.allocator = PageAllocator(config.pages, ps)
        self.tier: HostTier | None = None
        self.cache: RadixCache | None = None
        if config.prefix_cache:
            if config.host_pages:
                write_through = config.host_kv_policy == "write_through"
                self.tier = HostTier(config.host_pages, ps, write_through)
            self.cache = RadixCache(self.allocator, self.tier)
        self.host_hit_pages = 0  # pages admission found on the host only and loaded

    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def evictable(self) -> int:
        return self.cache.evictable_pages if self.cache is not None else 0

    def _fill_keys(self, req: Request) -> list[PageKey]:
        """Keys of the fill's full pages, leaving at least one token to compute (for logits)."""
        ps = self.page_size
        return req.page_keys((req.fill_len - 1) // ps, ps)

    def cached_pages_of(self, req: Request) -> int:
        """Leading fill pages of ``req`` the cache holds now (read-only)."""
        return self.cache.match_length(self._fill_keys(req)) if self.cache is not None else 0

    def fill_need(self, req: Request) -> tuple[int, int]:
        """(new pages ``req``'s fill needs, pages it may take: free + evictable outside its match).

        Read-only.
        """
        total = pages_for(req.fill_len, self.page_size)
        if self.cache is None:
            return total, self.allocator.num_free
        matched, locked = self.cache.probe(self._fill_keys(req))
        return total - matched, self.allocator.num_free + self.cache.evictable_pages - locked

    def allocate_fill(self, req: Request, need: int, tick: int) -> None:
        """Give ``req`` its cached prefix and ``need`` fresh pages (``fill_need`` said they fit)."""
        shared: list[int] = []
        loaded: list[int] = []
        cache = self.cache
        if cache is not None:
            shared, node = cache.match(self._fill_keys(req), tick)
            cache.lock(node)
            req.cache_node = node
        self.make_room(need)
        if cache is not None and cache.tier is not None and req.cache_node is not None:
            on_host = cache.host_path(req.cache_node)
            if on_host:
                loaded = self.allocator.alloc(sum(len(n.host) for n in on_host))
                cache.load(on_host, loaded)
                self.host_hit_pages += len(loaded)
        req.pages = (*shared, *loaded, *self.allocator.alloc(need - len(loaded)))
        req.num_shared_pages = len(shared) + len(loaded)
        req.num_planned = req.num_cached = req.num_shared_pages * self.page_size

    def take_copies(self) -> tuple[tuple[Copy, ...], tuple[Copy, ...]]:
        """The host tier's queued (writes, loads) for the plan being made."""
        return self.tier.take_copies() if self.tier is not None else ((), ())

    def make_room(self, need: int) -> bool:
        """Evict unreferenced cache pages, LRU first, toward ``need`` free pages; whether any
        were evicted."""
        short = need - self.allocator.num_free
        return self.cache is not None and short > 0 and self.cache.evict(short) > 0

    def add_pages(self, req: Request, n: int = 1) -> None:
        """Append ``n`` free pages to ``req``'s page table."""
        req.pages += tuple(self.allocator.alloc(n))

    def share_prefix(self, req: Request, computed: int, tick: int) -> HeldPages | None:
        """Hand the full pages of ``req``'s first ``computed`` positions to the cache (``req``
        keeps them locked), so requests running at the same time share them at once.

        Where the cache already holds a page for the same key (another request
        computed the same prefix meanwhile), the request switches to the cached
        page; its own copies are returned, to be freed.
        """
        cache = self.cache
        if cache is None:
            return None
        ps = self.page_size
        keys = req.page_keys(computed // ps, ps)
        n = len(keys)
        if n <= req.num_shared_pages:
            return None
        rejected = cache.insert(keys, req.pages[:n], tick)
        pages, node = cache.match(keys, tick)
        cache.lock(node)
        if req.cache_node is not None:
            cache.unlock(req.cache_node)
        req.pages = (*pages, *req.pages[n:])
        req.num_shared_pages = n
        req.cache_node = node
        return HeldPages((), rejected) if rejected else None

    def take(self, req: Request) -> HeldPages:
        """Take every page and the lock from ``req``; its planned positions' full pages are kept
        for the cache (their tokens are known and their KV is written once the plans in
        flight complete). Keys come from the prompt and the output, which holds verified
        tokens only: no page is keyed past them, so none by a draft token."""
        ps = self.page_size
        keys = req.page_keys(req.num_planned // ps, ps) if self.cache is not None else []
        held = HeldPages(keys, req.pages, req.cache_node, req.num_shared_pages)
        req.pages = ()
        req.cache_node = None
        req.num_shared_pages = 0
        req.num_planned = 0
        req.draft_in_flight = 0
        return held

    def give_back(self, held: HeldPages, tick: int) -> None:
        """Apply ``held``: computed full pages into the cache, the rest freed, the lock dropped."""
        n = len(held.keys)
        if self.cache is not None and n:
            self.allocator.free(self.cache.insert(held.keys, held.pages[:n], tick))
        self.allocator.free(held.pages[n:])
        if self.cache is not None and held.node is not None:
            self.cache.unlock(held.node)

    def host_stats(self) -> dict[str, int]:
        """The host tier's fields of ``SchedulerStats`` (empty without a tier)."""
        tier = self.tier
        if tier is None:
            return {}
        ps = self.page_size
        return {
            "host_pages": tier.num_slots,
            "host_pages_used": tier.num_slots - tier.num_free,
            "host_hit_tokens": self.host_hit_pages * ps,
            "host_loaded_tokens": tier.loaded_pages * ps,
            "host_written_tokens": tier.written_pages * ps,
        }
