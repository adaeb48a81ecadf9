"""The detokenizer holds a request's state only while the request lives, however it ends.

The step driver (``engine.scheduler_proc.driver``) runs requests on a stand-in
model and feeds its items to the real ``Detokenizer``, as every layout does;
the frontend layout's detokenizer, shared by the replicas, forgets the requests
of a replica that died (whose scheduler sends no final item).
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest
import torch
import zmq

from core.scheduler import Plan, SchedulerConfig
from engine.detokenizer.process import Detokenizer
from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.runner.args import RunnerArgs
from engine.runner.inputs import StepInputs
from engine.runner.step import StepHandle
from engine.sampling.params import SamplingParams
from engine.scheduler_proc.driver import Launched, StepDriver
from engine.server.errors import APIError
from engine.server.frontend import Frontend
from engine.server.inlets import FrontendText
from engine.server.metrics import ServerMetrics

TOKEN = 1000  # what the stand-in model samples; its text is a stop string of one request


@pytest.fixture(scope="module")
def tokenizer(model_ready: str) -> Any:
    from engine.tokenizer.prompt import load_tokenizer

    return load_tokenizer(model_ready)


def sampled_tokens(plan: Plan, inputs: StepInputs) -> StepHandle:
    return StepHandle(torch.full((len(plan.sampling_rids()),), TOKEN, dtype=torch.int64))


def add(driver: StepDriver, rid: str, prompt_len: int, stop: list[str] | None = None) -> None:
    params = SamplingParams(max_new_tokens=6, ignore_eos=True, stop=stop or [])
    ids = [100 + len(driver.tracked)] * prompt_len  # no two prompts share a page
    driver.add(messages.TokenizedRequest(rid, ids, params, received=0.0, tokenized=0.0))


@pytest.mark.parametrize("overlap", [False, True])
def test_aborted_stopped_and_finished_requests_leave_no_state(
    tokenizer: Any, overlap: bool
) -> None:
    """Aborted while waiting, in a chunked prefill and in decode, stopped by a stop string
    (aborted by the detokenizer) or run to their length: once the scheduler's items have
    passed the detokenizer, it holds nothing, the scheduler's final item of an abort
    included."""
    config = SchedulerConfig(num_pages=64, page_size=16, max_running=3, max_prefill_tokens=32)
    driver = StepDriver(config, sampled_tokens, eos_token_ids=[])
    detok = Detokenizer(tokenizer)
    add(driver, "decoding", 8)
    add(driver, "prefilling", 100)  # four chunks of 32 tokens at most
    add(driver, "stopped", 8, stop=[str(tokenizer.decode([TOKEN]))])
    add(driver, "waiting", 8)  # past max_running
    add(driver, "finished", 8)
    held: set[str] = set()
    ends: dict[str, str] = {}
    in_flight: Launched | None = None
    for step in range(40):
        if step == 2:
            for rid in ("decoding", "prefilling", "waiting"):
                driver.abort(rid, "client disconnected")
        items, in_flight, _ = driver.advance(in_flight, overlap)
        texts, stopped = detok.process(messages.TokenBatch(items=items))
        for rid in stopped:
            driver.abort(rid, "stop string")
        ends |= {t.rid: t.finish_reason for t in texts if t.finish_reason is not None}
        held |= set(detok.states)
        if not driver.has_work() and in_flight is None:
            break
    assert ends == {
        "decoding": "abort",
        "prefilling": "abort",
        "waiting": "abort",
        "stopped": "stop",
        "finished": "length",
    }
    assert {"decoding", "finished"} <= held  # a state between their items
    assert detok.states == {} and not detok.stopped


def test_the_frontend_forgets_the_requests_of_a_replica_that_died(
    model_ready: str, tmp_path: Path
) -> None:
    """``--layout frontend`` with two replicas: one token of a request on each, then replica
    1 dies; its request fails with 503 and leaves nothing in the shared detokenizer, while
    replica 0's runs on to its end."""
    cfg = ServeConfig(
        model="m", runner=RunnerArgs(model=model_ready), tokenizer_path=model_ready,
        vocab_size=49152, run_dir=str(tmp_path), parent_pid=os.getpid(), max_model_len=1024,
        dp_size=2, layout="frontend",
    )  # fmt: skip

    async def scenario() -> None:
        frontend = Frontend(cfg, ServerMetrics(cfg.model), {})
        await frontend.start()
        ctx = zmq.Context()
        scheduler = ctx.socket(zmq.PUSH)  # the schedulers' side
        scheduler.setsockopt(zmq.LINGER, 0)
        scheduler.connect(cfg.frontend_addr)
        try:
            params = SamplingParams(max_new_tokens=4)
            streams = [
                frontend.submit(messages.GenerateRequest(sampling=params, text="Hi"))
                for _ in range(2)
            ]
            by_replica = {s.result.replica: s for s in streams}
            assert sorted(by_replica) == [0, 1]

            def send(*items: messages.TokenItem) -> None:
                scheduler.send(messages.encode(messages.TokenBatch(items=list(items))))

            send(*(messages.TokenItem(rid=s.rid, token_ids=[TOKEN]) for s in streams))
            for s in streams:
                await s.next()
            assert isinstance(frontend._inlet, FrontendText)
            detokenizer = frontend._inlet.detokenizer
            assert set(detokenizer.states) == {s.rid for s in streams}
            frontend.replica_failed(1, "killed")
            with pytest.raises(APIError, match="replica 1 is down"):
                await by_replica[1].next()
            send(messages.TokenItem(rid=by_replica[0].rid, finish_reason="length"))
            assert (await by_replica[0].next()).finish_reason == "length"
            assert detokenizer.states == {}  # the batch came after the forget on its thread
        finally:
            scheduler.close()
            ctx.term()
            await frontend.stop()

    asyncio.run(scenario())
