"""Seeded random workloads for the host KV tier's tests, and a model of the KV content.

``run_workload`` feeds a scheduler a random mix of prompts that share prefixes
(adds, aborts, schedule and complete, strict or overlapped) and returns its
plans. ``KVContent`` executes plans the way the engine's contract says (a
plan's write-backs, then its loads, then its compute) on a model of the device
pages and host slots that holds, per KV position, the token it was computed
for; every read checks that the page holds the reader's token.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Callable

from core.scheduler import Plan, Request, Scheduler, SchedulerConfig
from core.scheduler.invariants import check_invariants

VOCAB = 4
TokenOf = Callable[[str, int], int]


def output_token(seed: int, rid: str, index: int) -> int:
    """The token a deterministic model samples as ``rid``'s output number ``index``."""
    return zlib.crc32(f"{seed}:{rid}:{index}".encode()) % VOCAB


class KVContent:
    """Device pages and host slots as maps slot -> token; plans applied in schedule order."""

    def __init__(self, page_size: int, token_of: TokenOf) -> None:
        self.page_size = page_size
        self.token_of = token_of
        self.device: dict[int, dict[int, int]] = {}
        self.host: dict[int, dict[int, int]] = {}

    def apply(self, plan: Plan) -> None:
        for page, slot in plan.writes:
            self.host[slot] = dict(self.device.get(page, {}))
        for slot, page in plan.loads:
            self.device[page] = dict(self.host.get(slot, {}))
        for c in plan.prefill:
            self._read(c.rid, c.pages, c.start)
            self._write(c.rid, c.pages, range(c.start, c.start + c.length))
        for d in plan.decode:
            self._read(d.rid, d.pages, d.position)
            self._write(d.rid, d.pages, range(d.position, d.position + 1))

    def _read(self, rid: str, pages: tuple[int, ...], end: int) -> None:
        ps = self.page_size
        for p in range(end):
            page = pages[p // ps]
            held, want = self.device.get(page, {}).get(p % ps), self.token_of(rid, p)
            assert held == want, f"{rid} reads position {p} from page {page}: {held} != {want}"

    def _write(self, rid: str, pages: tuple[int, ...], positions: range) -> None:
        ps = self.page_size
        for p in positions:
            self.device.setdefault(pages[p // ps], {})[p % ps] = self.token_of(rid, p)


def prefixes(seed: int, page_size: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 5) * page_size)] for _ in range(5)]


def run_workload(
    config: SchedulerConfig,
    seed: int,
    *,
    steps: int = 200,
    overlap: bool = False,
    content: bool = False,
    checked: bool = False,
) -> tuple[list[Plan], Scheduler]:
    """Drive a scheduler through ``steps`` random steps; its plans and the scheduler.

    ``content`` executes every plan on a ``KVContent`` (reads checked);
    ``checked`` runs the core's invariants after every call.
    """
    rng = random.Random(seed)
    s = Scheduler(config)
    shared = prefixes(seed, config.page_size)
    prompts: dict[str, list[int]] = {}

    def token_of(rid: str, p: int) -> int:
        prompt = prompts[rid]
        return prompt[p] if p < len(prompt) else output_token(seed, rid, p - len(prompt))

    kv = KVContent(config.page_size, token_of) if content else None
    plans: list[Plan] = []
    in_flight: list[Plan] = []
    for i in range(steps):
        if rng.random() < 0.4:
            rid = f"r{i}"
            prompt = rng.choice(shared) + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 12))]
            prompts[rid] = prompt
            max_new = rng.randint(1, 3 * config.page_size)
            s.add(Request(rid, len(prompt), max_new, arrival=float(i), prompt=prompt))
        if s.requests and rng.random() < 0.05:
            s.abort(rng.choice(sorted(s.requests)))
        if s.has_work() or in_flight:
            plan = s.schedule(float(i))
            plans.append(plan)
            if kv is not None:
                kv.apply(plan)
            in_flight.append(plan)
            keep = 1 if overlap and plan.has_model_work else 0
            while len(in_flight) > keep:
                done = in_flight.pop(0)
                s.complete(done, tokens_of(done, token_of))
        if checked:
            check_invariants(s)
    for done in in_flight:
        s.complete(done, tokens_of(done, token_of))
    return plans, s


def tokens_of(plan: Plan, token_of: TokenOf) -> dict[str, int]:
    """The sampled tokens of ``plan``'s sampling slots (the position after each)."""
    tokens = {c.rid: token_of(c.rid, c.start + c.length) for c in plan.prefill if c.samples}
    tokens.update({d.rid: token_of(d.rid, d.position + 1) for d in plan.decode})
    return tokens


def plans_digest(plans: list[Plan]) -> str:
    """A digest of the plans' fields that existed before the host tier (copies left out)."""
    h = hashlib.sha256()
    for plan in plans:
        d = plan.to_dict()
        d.pop("loads", None)
        d.pop("writes", None)
        h.update(repr(d).encode())
    return h.hexdigest()[:16]
