"""Host values to the device without waiting for the stream (``device_ints``), and
the log-probs a step gathers with them."""

from __future__ import annotations

import time

import pytest
import torch

from core.scheduler import Plan, PrefillChunk, SchedulerConfig
from engine.kvcache.host_pool import device_ints
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.sampling import SamplingParams
from engine.sampling.logprobs import pending_logprobs


def test_device_ints_on_cpu_are_the_values() -> None:
    t = device_ints([3, 0, 7], torch.device("cpu"))
    assert t.dtype == torch.int64 and t.tolist() == [3, 0, 7]
    assert device_ints([], torch.device("cpu")).shape == (0,)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_device_ints_do_not_wait_for_the_step_in_flight() -> None:
    """With a long kernel queued (the step in flight), the call returns at once; a copy from
    pageable memory would return only after the kernel."""
    device = torch.device("cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(1 << 31)  # type: ignore[no-untyped-call]  # about a second of cycles
    t0 = time.perf_counter()
    t = device_ints(list(range(64)), device)
    returned = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.cuda.synchronize()
    waited = time.perf_counter() - t0
    assert t.device.type == "cuda" and t.tolist() == list(range(64))
    assert waited > 0.1 and returned < waited / 10


@pytest.mark.parametrize("wanted", [(2, None, 1), (0, 3, 2)])
def test_a_step_returns_the_log_probs_of_the_rows_that_asked(
    wanted: tuple[int | None, ...],
) -> None:
    """Some rows or all of one step ask for log-probs (gathered by an index, or not at all):
    each gets the log-softmax of its own row of the step's logits."""
    runner = ModelRunner(
        RunnerArgs(model="tiny-llama", dummy_weights=True, scheduler=SchedulerConfig(num_pages=8))
    )
    chunks = tuple(PrefillChunk(rid, 0, 3, True, (i,)) for i, rid in enumerate("abc"))
    prompts = [[5, 6, 7], [9, 1, 4], [2, 2, 8]]
    params = [SamplingParams(temperature=0.0, logprobs=k) for k in wanted]
    inputs = StepInputs(prompts, [], params, [0, 0, 0])
    logits = runner.logits(Plan(0, prefill=chunks), inputs)
    assert logits is not None
    reference = torch.log_softmax(logits.float(), dim=-1)
    out = runner.step(Plan(1, prefill=chunks), inputs)
    for row, (k, token, entries) in enumerate(zip(wanted, out.tokens, out.logprobs, strict=True)):
        if k is None:
            assert entries is None
            continue
        assert entries is not None and entries[0].token_id == token
        assert entries[0].logprob == pytest.approx(float(reference[row, token]), abs=1e-4)
        assert entries[0].top_ids == reference[row].topk(k).indices.tolist()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_log_probs_go_to_pinned_memory_without_waiting() -> None:
    """A step's log-probs are copied to the host behind its tokens, not read from the device
    after the next step was launched (a read that would wait for that step)."""
    device = torch.device("cuda")
    logits = torch.randn(3, 100, device=device)
    pending = pending_logprobs(logits, torch.tensor([1, 2, 3], device=device), [2, 0, 1])
    torch.cuda._sleep(1 << 31)  # type: ignore[no-untyped-call]  # the next step, in flight
    t0 = time.perf_counter()
    host = pending.to_host()
    returned = time.perf_counter() - t0
    torch.cuda.synchronize()
    assert returned < 0.05 and host.chosen.is_pinned() and not host.top_ids.is_cuda
    assert host.entries([1, 2, 3]) == pending.entries([1, 2, 3])


def test_log_probs_on_the_host_stay_as_they_are() -> None:
    on_host = pending_logprobs(torch.randn(3, 100), torch.tensor([1, 2, 3]), [2, 0, 1])
    assert on_host.to_host() is on_host
