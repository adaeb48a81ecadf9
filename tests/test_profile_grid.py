"""``engine profile``'s grid: mixed steps after a prefix and at chosen contexts, and the points
a real runner cannot hold left out (more pages than the pool, or one sequence longer than a
request's page table, the model's context)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from conftest import MODEL

from engine.scheduler_proc.loop import runner_args
from lab.profile.grid import GridSpec, StepPoint
from lab.profile.main import serve_config
from lab.profile.steps import StepTimer, serving_runner


@contextmanager
def cpu_timer(num_pages: int) -> Iterator[StepTimer]:
    """A ``StepTimer`` on the CPU runner of the test model with ``num_pages`` KV pages."""
    with tempfile.TemporaryDirectory() as run_dir:
        argv = ["--model", MODEL, "--cpu-threads", "1", "--num-pages", str(num_pages)]
        cfg = serve_config(argv, run_dir)
    with serving_runner(runner_args(cfg)) as leader:
        runner = leader.runner
        yield StepTimer(leader, runner.page_size, runner.num_pages, cfg.vocab_size)


def test_points_beyond_the_pool_or_a_request_are_left_out(model_ready: str) -> None:
    with cpu_timer(1024) as timer:
        runner = timer.runner
        longest = runner.max_pages_per_seq * runner.page_size  # tokens a request may hold
        assert runner.max_pages_per_seq < runner.num_pages
        assert timer.fits(StepPoint((), (longest - 1,)))  # its new token is the last slot
        assert not timer.fits(StepPoint((), (longest,)))
        assert not timer.fits(StepPoint(((longest - 16, 32),), ()))
        assert timer.fits(StepPoint(((longest - 32, 32),), ()))
        half = runner.num_pages * runner.page_size // 2
        assert not timer.fits(StepPoint((), (half - 1,) * 3))  # 1.5 pools


def test_mixed_rows_cross_their_prefixes_and_contexts() -> None:
    grid = replace(
        GridSpec.default("cpu"),
        mixed_prefill=(16,),
        mixed_batches=(2,),
        mixed_prefixes=(0, 64),
        mixed_contexts=(32, 128),
        holdout=30,
    )
    [ragged] = grid.ragged(2)
    assert ragged == (2048, 128)
    two = replace(grid, ragged_longest=(512, 2048))  # both sides of a backend's threshold
    assert two.ragged(3) == [(512, 128, 128), (2048, 128, 128)]
    points = [p for p in grid.points() if p.split == "fit"]
    mixed = {(p.prefill, p.decode) for p in points if p.prefill and p.decode}
    assert mixed == {
        (((start, 16),), decode) for start in (0, 64) for decode in ((32, 32), (128, 128), ragged)
    }
    held = [p for p in grid.holdout_points() if p.prefill and p.decode]
    assert held and all(0 <= p.prefill[0][0] <= 64 for p in held)
    assert any(p.prefill[0][0] > 0 for p in held)
    # one mixed prefix (the default) draws none: the default grid's held-out points are as before
    assert GridSpec.default("cpu").mixed_contexts == (512,)
    default = GridSpec.default("cuda").points()
    assert all(p.prefill[0][0] == 0 for p in default if p.prefill and p.decode)


def test_a_plan_takes_scattered_pages_in_the_order_given() -> None:
    """``--scatter-pages``: the same sequences, their pages drawn from a shuffled pool."""
    point = StepPoint(((32, 40),), (100, 7))
    contiguous = point.plan(16)
    order = list(reversed(range(64)))
    scattered = point.plan(16, order)
    assert [c.pages for c in contiguous.prefill] == [(0, 1, 2, 3, 4)]
    assert [c.pages for c in scattered.prefill] == [(63, 62, 61, 60, 59)]
    assert [len(d.pages) for d in scattered.decode] == [len(d.pages) for d in contiguous.decode]
    taken = [p for seq in (*scattered.prefill, *scattered.decode) for p in seq.pages]
    assert len(set(taken)) == len(taken) == sum(point.sequence_pages(16))
    assert sorted(taken) == list(range(64 - len(taken), 64))


def test_a_verify_plan_runs_on_the_cpu_runner(model_ready: str) -> None:
    """A verify step (every slot with a draft) runs as the extends the engine lays out."""
    with cpu_timer(256) as timer:
        row = timer.run(StepPoint((), (60, 90), draft=2), repeats=1, warmup=0)
    assert row.kind == "prefill" and row.shape.prefill_tokens == 6 and row.duration_s > 0
