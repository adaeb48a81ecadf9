"""Tensor parallelism on CPU: two processes over gloo give the same tokens as one.

SmolLM2 has 9 query / 3 KV heads, so two ranks split them unevenly (2 + 1 KV
heads); the MLP splits 1536 = 768 + 768. Rank 1 runs ``follower_main`` in a
spawned process; this process is rank 0.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from tp_helpers import tp_leader
from transformers import AutoTokenizer

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from engine.distributed.parallel import head_partition, split_range
from engine.ipc.messages import TokenizedRequest
from engine.models.setup import ensure_model
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.runner.tp import TPLeader, decode_step, encode_step, follower_main
from engine.sampling import SamplingParams
from engine.scheduler_proc.driver import Launched, LaunchFn, StepDriver

torch.set_num_threads(1)

QUESTIONS = ["What is the capital of France?", "List three prime numbers.", "Say hello."]


def test_head_partition_covers_every_head_once() -> None:
    for heads, kv, tp in [(9, 3, 2), (32, 8, 4), (16, 8, 3), (14, 2, 4), (8, 1, 2)]:
        shards = [head_partition(heads, kv, tp, r) for r in range(tp)]
        assert sum(s.q_count for s in shards) == heads
        assert [s.q_start for s in shards] == sorted(s.q_start for s in shards)
        group = heads // kv
        for s in shards:
            first_kv = s.q_start // group
            last_kv = (s.q_start + s.q_count - 1) // group
            assert s.kv_start == first_kv and s.kv_start + s.kv_count - 1 == last_kv
    assert [split_range(10, 3, i) for i in range(3)] == [(0, 4), (4, 3), (7, 3)]
    with pytest.raises(ValueError, match="cannot split"):
        head_partition(6, 2, 3, 0)
    with pytest.raises(ValueError, match="cannot split"):
        head_partition(4, 2, 8, 0)


def test_step_wire_roundtrip() -> None:
    plan = Plan(
        3,
        prefill=(PrefillChunk("a", 16, 5, True, (4, 2)),),
        decode=(DecodeSlot("b", 40, (1, 7, 9)),),
    )
    inputs = StepInputs(
        [[1, 2, 3, 4, 5]], [9], [SamplingParams(temperature=0.5, seed=3)] * 2, [0, 7]
    )
    assert decode_step(encode_step(plan, inputs)) == (plan, inputs)


def _generate(
    launch: LaunchFn, prompts: list[list[int]], overlap: bool = False
) -> dict[str, list[int]]:
    """Greedy tokens through the real scheduler; with ``overlap`` step N+1 is launched before
    step N is finished, so the ranks read decode inputs from their own last samples."""
    engine = StepDriver(SchedulerConfig(num_pages=64, max_prefill_tokens=24), launch, [2])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    for i, ids in enumerate(prompts):
        engine.add(TokenizedRequest(f"r{i}", ids, greedy, 0.0, 0.0))
    out: dict[str, list[int]] = {}
    in_flight: Launched | None = None
    while engine.has_work() or in_flight is not None:
        items, in_flight, _ = engine.advance(in_flight, overlap)
        for item in items:
            out.setdefault(item.rid, []).extend(item.token_ids)
    return out


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    tok = AutoTokenizer.from_pretrained(str(ensure_model("smollm2-135m")))
    out = []
    for q in QUESTIONS:
        ids: Any = tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True
        )
        out.append([int(i) for i in (ids if isinstance(ids, list) else ids["input_ids"])])
    return out


@pytest.fixture
def tp2_leader(tmp_path: Path) -> Iterator[TPLeader]:
    args = RunnerArgs(
        model="smollm2-135m",
        tp_size=2,
        scheduler=SchedulerConfig(num_pages=64),
        dist_init=f"file://{tmp_path / 'rendezvous'}",
        cpu_threads=1,
    )
    with tp_leader(args) as leader:
        yield leader


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tp2_greedy_equals_tp1(tp2_leader: TPLeader, prompts: list[list[int]]) -> None:
    tp1 = ModelRunner(
        RunnerArgs(model="smollm2-135m", scheduler=SchedulerConfig(num_pages=64), cpu_threads=1)
    )
    expected = _generate(tp1.launch, prompts)
    del tp1
    assert tp2_leader.runner.kv.num_kv_heads == 2  # rank 0 holds 2 of the 3 KV heads
    assert _generate(tp2_leader.launch, prompts) == expected


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_tp4_greedy_equals_tp1(tmp_path: Path) -> None:
    """Four gloo ranks of the toy Llama (4 query / 2 KV heads: each KV head on two ranks)."""
    base = RunnerArgs(
        model="tiny-llama",
        dummy_weights=True,
        scheduler=SchedulerConfig(num_pages=64),
        cpu_threads=1,
    )
    prompts = [[(7 * i + j) % 500 + 3 for j in range(n)] for i, n in enumerate((5, 30, 17))]
    expected = _generate(ModelRunner(base).launch, prompts)
    args = replace(base, tp_size=4, dist_init=f"file://{tmp_path / 'rendezvous'}")
    with tp_leader(args) as leader:
        assert leader.runner.kv.num_kv_heads == 1
        assert _generate(leader.launch, prompts) == expected
        assert _generate(leader.launch, prompts, overlap=True) == expected


def _leader_then_hang(args: RunnerArgs, ready: Path) -> None:
    TPLeader(args)
    ready.touch()
    time.sleep(600)


@pytest.mark.timeout(120)
def test_follower_exits_when_rank0_dies(tmp_path: Path) -> None:
    args = RunnerArgs(
        model="tiny-llama",
        dummy_weights=True,
        tp_size=2,
        scheduler=SchedulerConfig(num_pages=8),
        dist_init=f"file://{tmp_path / 'rendezvous'}",
        cpu_threads=1,
    )
    ctx = mp.get_context("spawn")
    ready = tmp_path / "ready"
    follower = ctx.Process(target=follower_main, args=(args, 1))
    leader = ctx.Process(target=_leader_then_hang, args=(args, ready))
    follower.start()
    leader.start()
    try:
        deadline = time.monotonic() + 90
        while not ready.exists() and time.monotonic() < deadline and leader.is_alive():
            time.sleep(0.2)
        assert ready.exists(), "rank 0 did not come up"
        assert follower.is_alive()
        os.kill(leader.pid, signal.SIGKILL)  # type: ignore[arg-type]
        follower.join(timeout=30)
        assert follower.exitcode == 1
    finally:
        for proc in (leader, follower):
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10)
