"""Property tests of the router core: placement, health, balance, prefix affinity, bookkeeping."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.router import (
    POLICIES,
    Health,
    NoWorkerAvailable,
    PrefixTree,
    Router,
    RouterConfig,
    RouteRequest,
)

BUDGET = settings(max_examples=150, deadline=None)
PREFIXES = [(1, 2, 3), (1, 2, 4), (7,), (7, 8, 9, 10), (5, 5), ()]

configs = st.builds(
    RouterConfig,
    policy=st.sampled_from(sorted(POLICIES)),
    load=st.sampled_from(["requests", "tokens"]),
    seed=st.integers(0, 3),
    cache_threshold=st.sampled_from([0.0, 0.3, 0.5, 0.9]),
    balance_abs_threshold=st.integers(0, 4),
    balance_rel_threshold=st.sampled_from([1.0, 1.5, 3.0]),
    prefix_ttl_s=st.sampled_from([1.0, 5.0, 1000.0]),
    max_prefix_items=st.sampled_from([2, 8, 1 << 20]),
    session_ttl_s=st.sampled_from([1.0, 1000.0]),
)
keys = st.tuples(st.sampled_from(PREFIXES), st.lists(st.integers(0, 3), max_size=3)).map(
    lambda t: t[0] + tuple(t[1])
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("route"), keys, st.integers(0, 50), st.sampled_from([None, "u1", "u2"])),
        st.tuples(st.just("finish"), st.integers(0, 1000)),
        st.tuples(st.just("abort"), st.integers(0, 1000)),
        st.tuples(st.just("health"), st.integers(0, 10), st.sampled_from(list(Health))),
        st.tuples(st.just("advance"), st.sampled_from([0.1, 0.5, 2.0, 10.0])),
        st.tuples(st.just("add")),
        st.tuples(st.just("remove"), st.integers(0, 10)),
    ),
    max_size=60,
)


@dataclass
class Run:
    """What a sequence of calls did: the decisions, and the load seen before each."""

    decisions: list[tuple[str, str]] = field(default_factory=list)
    ended: set[str] = field(default_factory=set)


def drive(config: RouterConfig, steps: list[tuple[object, ...]], num_workers: int) -> Run:
    """Apply ``steps`` to a fresh router, checking the placement invariants at every call."""
    router = Router(config, [f"w{i}" for i in range(num_workers)])
    run, now, added = Run(), 0.0, num_workers
    for n, step in enumerate(steps):
        kind = step[0]
        if kind == "route":
            _, key, tokens, session = step
            req = RouteRequest(f"r{n}", key, int(tokens), 1, session)  # type: ignore[arg-type]
            routable = {s.worker: s for s in router.stats() if s.health is Health.HEALTHY}
            if not routable:
                with pytest.raises(NoWorkerAvailable):
                    router.route(req, now)
                continue
            worker = router.route(req, now)
            assert worker in routable, "routed to a worker that is not healthy"
            if config.policy == "cache_aware":
                loads = {w: s.outstanding_tokens if config.load == "tokens"
                         else s.outstanding_requests for w, s in routable.items()}  # fmt: skip
                assert not config.imbalanced(loads[worker], min(loads.values()))
            run.decisions.append((req.rid, worker))
        elif kind in ("finish", "abort") and router.outstanding:
            rid = sorted(router.table.open)[int(step[1]) % router.outstanding]  # type: ignore[call-overload]
            end = router.finished if kind == "finish" else router.aborted
            assert end(rid, now) is not None
            assert end(rid, now) is None, "a second end of the same rid is ignored"
            run.ended.add(rid)
        elif kind == "health" and router.workers:
            router.set_health(router.workers[int(step[1]) % len(router.workers)], step[2])  # type: ignore[call-overload, arg-type]
        elif kind == "advance":
            now += float(step[1])  # type: ignore[arg-type]
        elif kind == "add":
            router.add_worker(f"w{added}")
            added += 1
        elif kind == "remove" and router.workers:
            worker = router.workers[int(step[1]) % len(router.workers)]  # type: ignore[call-overload]
            open_before = set(router.open_requests(worker))
            assert set(router.remove_worker(worker)) == open_before
            run.ended |= open_before
        router.table.check()
    for rid in sorted(router.table.open):
        router.aborted(rid, now)
    assert router.outstanding == 0
    assert all(s.outstanding_requests == s.outstanding_tokens == 0 for s in router.stats())
    return run


@BUDGET
@given(configs, ops, st.integers(1, 4))
def test_placement_health_balance_and_books(config: RouterConfig, steps: list, n: int) -> None:
    drive(config, steps, n)


@BUDGET
@given(configs, ops, st.integers(1, 4))
def test_same_inputs_same_decisions(config: RouterConfig, steps: list, n: int) -> None:
    assert drive(config, steps, n).decisions == drive(config, steps, n).decisions


@BUDGET
@given(st.lists(st.tuples(keys, st.integers(0, 2), st.sampled_from([0.0, 0.4, 3.0])), max_size=40))
def test_prefix_tree_matches_what_each_worker_was_sent(sent: list) -> None:
    """Without the size bound, a worker's match is the longest live common prefix it was sent."""
    ttl, tree, now, log = 2.0, PrefixTree(2.0, 1 << 20), 0.0, []
    workers = ["a", "b", "c"]
    for key, w, dt in sent:
        now += dt
        for probe in (key, key[:1], (*key, 99)):
            want = {
                x: max([common(probe, k) for k, y, t in log if y == x and now - t < ttl], default=0)
                for x in workers
            }
            assert tree.match(probe, workers, now) == want
        tree.insert(key, workers[w], now)
        log.append((key, workers[w], now))


@BUDGET
@given(st.lists(st.tuples(keys, st.integers(0, 1), st.sampled_from([1.0, 4.0, 512.0])),
                max_size=40), st.integers(1, 6))  # fmt: skip
def test_prefix_tree_size_bound(sent: list, bound: int) -> None:
    """Each worker's entries stay within the bound, and its tokens are those of its entries."""
    tree = PrefixTree(1000.0, bound)
    for i, (key, w, item_tokens) in enumerate(sent):
        tree.insert(key, str(w), float(i), item_tokens)
        for x in ("0", "1"):
            held = [node for node in tree._nodes() if x in node.tenants]
            assert len(held) == tree.size.get(x, 0) <= bound
            assert tree.tokens.get(x, 0.0) == pytest.approx(sum(n.tokens for n in held))
        assert all(node.tenants or node.children for node in tree._nodes())


def test_a_new_prefix_goes_to_the_tree_of_fewer_tokens_not_fewer_entries() -> None:
    """Worker a holds one trace request of three 512-token blocks (3 entries, 1,536 tokens),
    worker b one text prompt of 200 chunks of 4 tokens (200 entries, 800 tokens): a prompt
    that matches neither goes to b, whose tree stands for fewer tokens."""
    router = Router(RouterConfig(policy="cache_aware"), ["a", "b"])
    blocks = RouteRequest("r0", (1, 2, 3), input_tokens=1536)
    text = RouteRequest("r1", tuple(f"chunk{i}" for i in range(200)), input_tokens=800)
    assert router.route(blocks, 0.0) == "a"
    assert router.route(text, 0.0) == "b"
    router.finished("r0", 0.1)
    router.finished("r1", 0.1)
    assert router.route(RouteRequest("r2", ("new",), input_tokens=4), 0.2) == "b"


def common(a: tuple[object, ...], b: tuple[object, ...]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@BUDGET
@given(st.lists(st.sampled_from(PREFIXES[:-1]), min_size=1, max_size=30), st.integers(2, 4))
def test_cache_aware_repeats_go_where_the_prefix_is(prompts: list, n: int) -> None:
    """With ample balance room, a repeated key lands on a worker that was sent it (or a longer
    key that starts with it); keys that are never prefixes of each other each keep one home."""
    config = RouterConfig(policy="cache_aware", balance_abs_threshold=100, cache_threshold=0.5)
    router = Router(config, [f"w{i}" for i in range(n)])
    sent: dict[str, list[tuple[int, ...]]] = {}
    for i, key in enumerate(prompts):
        holders = {w for w, ks in sent.items() if any(k[: len(key)] == key for k in ks)}
        worker = router.route(RouteRequest(f"r{i}", key), float(i))
        assert not holders or worker in holders
        sent.setdefault(worker, []).append(key)
    prefix_free = [(1, 2, 3), (1, 2, 4), (7, 8, 9, 10), (5, 5)]
    router = Router(config, [f"w{i}" for i in range(n)])
    home: dict[tuple[int, ...], str] = {}
    for i, key in enumerate(k for k in prompts + prompts if k in prefix_free):
        worker = router.route(RouteRequest(f"r{i}", key), float(i))
        assert home.setdefault(key, worker) == worker


def test_cache_aware_spills_when_the_home_is_overloaded() -> None:
    config = RouterConfig(policy="cache_aware", balance_abs_threshold=2, balance_rel_threshold=1.0)
    router = Router(config, ["a", "b"])
    placed = [router.route(RouteRequest(f"r{i}", (1, 2, 3)), 0.0) for i in range(5)]
    assert placed[:3] == ["a", "a", "a"] and placed[3] == "b"
    assert router.decisions["cache_hit"] >= 2 and router.decisions["cache_miss"] >= 2


def test_draining_and_dead_workers_get_nothing_but_finish_their_requests() -> None:
    router = Router(RouterConfig(policy="round_robin"), ["a", "b", "c"])
    first = [router.route(RouteRequest(f"r{i}"), 0.0) for i in range(3)]
    assert first == ["a", "b", "c"]
    router.set_health("b", Health.DRAINING)
    router.set_health("c", Health.DEAD)
    assert {router.route(RouteRequest(f"s{i}"), 1.0) for i in range(4)} == {"a"}
    assert router.finished("r1", 2.0) == "b" and router.aborted("r2", 2.0) == "c"
    with pytest.raises(NoWorkerAvailable):
        router.route(RouteRequest("y"), 3.0, exclude={"a"})


def test_session_sticky_pins_and_repins() -> None:
    router = Router(RouterConfig(policy="session_sticky", session_ttl_s=10.0), ["a", "b"])
    home = router.route(RouteRequest("r0", session="u"), 0.0)
    router.route(RouteRequest("r1"), 0.0)  # a request without a session goes to the other
    assert router.route(RouteRequest("r2", session="u"), 1.0) == home
    router.set_health(home, Health.DEAD)
    other = router.route(RouteRequest("r3", session="u"), 2.0)
    assert other != home
    router.set_health(home, Health.HEALTHY)
    assert router.route(RouteRequest("r4", session="u"), 3.0) == other


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("load", "bytes", "load must be one of"),
        ("cache_threshold", 1.5, "cache_threshold must be in"),
        ("balance_rel_threshold", 0.5, "balance_rel_threshold must be >= 1"),
        ("prefix_ttl_s", 0.0, "prefix_ttl_s must be > 0"),
        ("max_prefix_items", 0, "max_prefix_items must be >= 1"),
    ],
)
def test_config_errors_say_what_is_wrong(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RouterConfig(**{field: value})  # type: ignore[arg-type]


def test_an_unknown_policy_is_an_error() -> None:
    with pytest.raises(ValueError, match="unknown router policy 'nope'; known: cache_aware"):
        Router(RouterConfig(policy="nope"), ["a"])


def test_duplicate_rid_and_unknown_worker_are_errors() -> None:
    router = Router(RouterConfig(), ["a"])
    router.route(RouteRequest("r"), 0.0)
    with pytest.raises(ValueError, match="already open"):
        router.route(RouteRequest("r"), 0.0)
    with pytest.raises(ValueError, match="unknown worker"):
        router.set_health("zz", Health.DEAD)
    with pytest.raises(ValueError, match="already known"):
        router.add_worker("a")


def test_flush_forgets_prefixes_but_keeps_open_requests() -> None:
    """After ``flush`` a repeated prefix matches nothing (it goes where a new router would
    send it), while the requests open before it keep their worker and their load."""
    router = Router(RouterConfig(policy="cache_aware"), ["a", "b"])
    key = (1, 2, 3, 4)
    router.route(RouteRequest("r0", (9,), input_tokens=512), 0.0)  # a new prefix: a
    assert router.route(RouteRequest("r1", key, input_tokens=2048), 0.0) == "b"
    router.finished("r1", 0.1)
    assert router.route(RouteRequest("r2", key, input_tokens=2048), 0.2) == "b"  # its match
    router.finished("r2", 0.3)
    router.flush()
    assert router.worker_of("r0") == "a" and router.outstanding == 1
    # no match now, both trees empty: the less loaded worker, b (a still holds r0)
    assert router.route(RouteRequest("r3", (7, 7), input_tokens=512), 0.4) == "b"
    assert router.route(RouteRequest("r4", key, input_tokens=2048), 0.5) == "a"
    assert router.finished("r0", 0.6) == "a"


def test_a_trace_block_key_is_matched_by_its_share_of_the_tokens() -> None:
    """A conversation's next turn (1,619 tokens, two of its four 512-token blocks cached on
    worker ``a``) is 63 % matched, over the threshold; counted in blocks it would be 2 of 4."""
    config = RouterConfig(policy="cache_aware", balance_abs_threshold=100, cache_threshold=0.5)
    router = Router(config, ["a", "b"])
    first = RouteRequest("r1", (0, 7, 8), 1153, block_tokens=512)
    assert router.route(first, 0.0) == "a"
    assert router.route(RouteRequest("r2", (0, 9), 1024, block_tokens=512), 0.1) == "b"
    turn = RouteRequest("r3", (0, 7, 10, 11), 1619, block_tokens=512)
    assert turn.share(2) == pytest.approx(1024 / 1619)
    assert router.route(turn, 0.2) == "a" and router.decisions["cache_hit"] == 1
    coarse = Router(config, ["a", "b"])
    coarse.route(RouteRequest("r1", (0, 7, 8), 1153), 0.0)
    coarse.route(RouteRequest("r2", (0, 9), 1024), 0.1)
    assert coarse.route(RouteRequest("r3", (0, 7, 10, 11), 1619), 0.2) == "b"  # 2 of 4 items
