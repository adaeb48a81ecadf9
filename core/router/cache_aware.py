"""``cache_aware``: the longest cached prefix, while the load stays balanced (SGLang's router).

For each request, among the healthy workers whose load is *balanced* against
the least loaded one (``RouterConfig.imbalanced``), take the one whose
approximate prefix tree matches the longest prefix of the key (ties: the less
loaded, then the first added). If that match covers more than
``cache_threshold`` of the prompt (``RouteRequest.share``: in tokens for a
trace's 512-token blocks, whose last one is partial; a share counted in blocks
sent a conversation's next turn elsewhere than the server, which keys text,
``reports/cluster/``), send it there ("cache_hit"); else send it to
the balanced worker whose tree holds the fewest prompt tokens, SGLang's "most
available cache capacity" (ties: the less loaded, then the first added;
"cache_miss"): new prefixes spread over the workers whatever their momentary
load. A tree's entries are weighed by the tokens they stand for (a request's
tokens over its key's items), not counted: the server keys text in 16-character
chunks and a trace's requests by 512-token blocks, and counted entries made the
two worlds place a conversation's first turn differently
(``reports/cluster/``). Whichever worker gets it, the
key goes into that worker's tree. The least loaded worker is always balanced, so
a request never lands on a worker beyond the balance threshold.
"""

from __future__ import annotations

from collections.abc import Sequence

from core.router.config import RouterConfig
from core.router.policy import Decision, Policy, register
from core.router.prefix_tree import PrefixTree
from core.router.request import RouteRequest, WorkerLoad


@register
class CacheAware(Policy):
    name = "cache_aware"

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.tree = PrefixTree(config.prefix_ttl_s, config.max_prefix_items)

    def choose(self, req: RouteRequest, workers: Sequence[WorkerLoad], now: float) -> Decision:
        unit = self.config.load
        least = self.least_loaded(workers)
        if not req.key:
            return Decision(least.worker, "least_loaded")
        balanced = [
            w for w in workers if not self.config.imbalanced(w.load(unit), least.load(unit))
        ]
        matched = self.tree.match(req.key, [w.worker for w in balanced], now)
        best = max(balanced, key=lambda w: (matched[w.worker], -w.load(unit)))
        if req.share(matched[best.worker]) > self.config.cache_threshold:
            return Decision(best.worker, "cache_hit")
        roomiest = min(balanced, key=lambda w: (self.tree.tokens.get(w.worker, 0.0), w.load(unit)))
        return Decision(roomiest.worker, "cache_miss")

    def routed(self, req: RouteRequest, worker: str, now: float) -> None:
        if req.key:
            per_item = req.input_tokens / len(req.key) if req.input_tokens > 0 else 1.0
            self.tree.insert(req.key, worker, now, per_item)

    def forget(self, worker: str) -> None:
        self.tree.remove_worker(worker)
