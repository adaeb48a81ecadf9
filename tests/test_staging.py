"""Host values to the device without waiting for the stream (``device_ints``), the log-probs
a step gathers with them, and a step's arrays packed per dtype into one pinned buffer
(``Staging``)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from core.scheduler import Plan, PrefillChunk, SchedulerConfig
from engine.kvcache.host_pool import device_ints
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.runner.staging import ALIGN, Region, Staging, layout, pack
from engine.sampling import SamplingParams
from engine.sampling.logprobs import pending_logprobs

STAGED = [np.dtype(d) for d in (np.int32, np.int64, np.float32, np.bool_)]


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


def step_arrays() -> list[np.ndarray]:
    """Every staged dtype, in arrays that are empty, 0-d, multi-dimensional or
    non-contiguous."""
    grid = np.arange(12, dtype=np.int64).reshape(3, 4)
    return [
        np.array([3], np.int64),
        np.array([True, False, True]),
        grid.T,
        np.empty(0, np.int32),
        np.array([1.5, -2.0, 0.25], np.float32)[::2],
        np.array(7, np.int32),
        np.arange(5, dtype=np.int32),
        np.empty((2, 0), np.float32),
        np.empty(0, np.int64),
    ]


def check_regions(regions: list[Region], total: int, arrays: Sequence[np.ndarray]) -> None:
    """One region per dtype, in the order the dtypes first appear, each holding its arrays in
    input order; regions start aligned, do not overlap and fit in ``total`` bytes."""
    dtypes = list(dict.fromkeys(a.dtype for a in arrays))
    assert [r.dtype for r in regions] == dtypes
    assert sorted(i for r in regions for i in r.members) == list(range(len(arrays)))
    end = 0
    for r in regions:
        assert r.members == sorted(r.members)
        assert all(arrays[i].dtype == r.dtype for i in r.members)
        assert r.sizes == [arrays[i].size for i in r.members]
        assert r.nbytes == sum(arrays[i].nbytes for i in r.members)
        assert r.start % ALIGN == 0 and r.start >= end
        end = r.start + r.nbytes
    assert end <= total and total % ALIGN == 0 and total >= ALIGN


def unpack(buf: np.ndarray, regions: list[Region], like: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The arrays that ``pack`` wrote into ``buf``, read back as ``Staging`` views them."""
    out: dict[int, np.ndarray] = {}
    for r in regions:
        typed = buf[r.start : r.start + r.nbytes].view(r.dtype)
        parts = np.split(typed, np.cumsum(r.sizes)[:-1])
        for i, part in zip(r.members, parts, strict=True):
            out[i] = part.reshape(like[i].shape)
    return [out[i] for i in range(len(like))]


def test_each_array_lands_at_its_offset_in_its_dtypes_region() -> None:
    arrays = step_arrays()
    regions, total = layout(arrays)
    check_regions(regions, total, arrays)
    assert [r.members for r in regions] == [[0, 2, 8], [1], [3, 5, 6], [4, 7]]
    buf = np.full(total, 0xAB, np.uint8)
    pack(arrays, regions, buf)
    for r in regions:
        offset = r.start
        for i in r.members:
            a = arrays[i]
            assert buf[offset : offset + a.nbytes].tobytes() == a.tobytes()
            offset += a.nbytes


def test_a_dtype_of_empty_arrays_takes_no_bytes() -> None:
    arrays: list[np.ndarray] = [
        np.empty(0, np.int64),
        np.empty((0, 3), np.int64),
        np.ones(2, np.int32),
    ]
    regions, total = layout(arrays)
    assert [(r.start, r.nbytes) for r in regions] == [(0, 0), (0, 8)] and total == ALIGN
    buf = np.zeros(total, np.uint8)
    pack(arrays, regions, buf)
    assert [a.shape for a in unpack(buf, regions, arrays)] == [(0,), (0, 3), (2,)]
    assert layout([]) == ([], ALIGN)


def test_an_unstaged_dtype_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="cannot stage arrays of dtype float64"):
        layout([np.array([1], np.int32), np.array([1.0])])


@st.composite
def staged_arrays(draw: st.DrawFn) -> np.ndarray:
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5)
    a: np.ndarray = draw(hnp.arrays(st.sampled_from(STAGED), shapes))
    view = draw(st.sampled_from(["as is", "transposed", "strided"]))
    if view == "transposed":
        return a.T
    return a[..., ::2] if view == "strided" and a.ndim else a


@settings(max_examples=50, deadline=None)
@given(st.lists(staged_arrays(), max_size=12))
def test_packed_arrays_read_back_identical(arrays: list[np.ndarray]) -> None:
    regions, total = layout(arrays)
    check_regions(regions, total, arrays)
    buf = np.full(total, 0xAB, np.uint8)
    pack(arrays, regions, buf)
    for got, a in zip(unpack(buf, regions, arrays), arrays, strict=True):
        assert got.dtype == a.dtype and got.shape == a.shape and got.tobytes() == a.tobytes()


def assert_uploaded(tensors: list[torch.Tensor], arrays: Sequence[np.ndarray]) -> None:
    for t, a in zip(tensors, arrays, strict=True):
        got = t.cpu().numpy()
        assert got.dtype == a.dtype and got.shape == a.shape and np.array_equal(got, a)


def test_on_cpu_the_arrays_are_wrapped() -> None:
    """(0-d arrays are left out: ``np.ascontiguousarray`` makes them 1-d on CPU.)"""
    arrays = [a for a in step_arrays() if a.ndim]
    assert_uploaded(Staging(torch.device("cpu")).upload(arrays), arrays)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_uploads_round_trip_through_a_growing_pinned_buffer() -> None:
    """A first upload past the buffer's capacity grows it; a later one rewrites it only after
    the device has read the earlier bytes, so every upload keeps its own values."""
    staging = Staging(torch.device("cuda"), capacity=16)
    first = step_arrays()
    second = [np.arange(100, dtype=np.int64), *(np.flip(a) for a in reversed(first))]
    got_first = staging.upload(first)
    got_second = staging.upload(second)
    assert all(t.is_cuda for t in got_first + got_second)
    assert_uploaded(got_first, first)
    assert_uploaded(got_second, second)
