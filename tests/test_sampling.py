"""Sampling parameters and the batched sampler."""

from __future__ import annotations

import msgspec
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.sampling import SamplingParams
from engine.sampling.sampler import Sampler, exponential_from_hash

torch.set_num_threads(1)
VOCAB = 50


def _logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed)) * 3


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("temperature", -0.1, "temperature"),
        ("temperature", float("nan"), "temperature"),
        ("top_p", 0.0, "top_p"),
        ("top_p", 1.5, "top_p"),
        ("top_k", -2, "top_k"),
        ("seed", -1, "seed"),
        ("max_new_tokens", 0, "max_new_tokens"),
        ("stop", [""], "stop"),
        ("stop_token_ids", [-3], "stop_token_ids"),
    ],
)
def test_invalid_params_rejected(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value}).validate()  # type: ignore[arg-type]


def test_params_wire_roundtrip_and_defaults() -> None:
    p = SamplingParams(temperature=0.7, top_k=5, seed=11, stop=["\n"], stop_token_ids=[2])
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(p), type=SamplingParams) == p
    assert SamplingParams().validate() == SamplingParams()
    assert SamplingParams(temperature=0.0).is_greedy and SamplingParams(top_k=1).is_greedy


def test_greedy_like_settings_equal_argmax() -> None:
    logits = _logits(6)
    greedy = logits.argmax(-1).tolist()
    sampler = Sampler(seed=5)
    for params in (
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.3, top_k=1),
        SamplingParams(temperature=1.3, top_p=1e-6),
        SamplingParams(temperature=1e-7),
    ):
        assert sampler.sample(logits, [params] * 6, list(range(6))) == greedy


def test_seeded_sampling_is_reproducible_and_batch_independent() -> None:
    logits = _logits(4, seed=1)
    params = [SamplingParams(temperature=1.0, seed=s) for s in (1, 2, 3, 4)]
    a = Sampler(seed=0).sample(logits, params, [0, 0, 0, 0])
    b = Sampler(seed=99).sample(logits, params, [0, 0, 0, 0])
    assert a == b
    alone = Sampler().sample(logits[2:3], params[2:3], [0])
    assert alone == a[2:3]
    draws = {Sampler().sample(logits[:1], params[:1], [i])[0] for i in range(40)}
    assert len(draws) > 1, "the output index must change the draw"


def test_top_k_and_top_p_restrict_support_and_follow_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05] + [1e-9] * (VOCAB - 4)]))
    sampler = Sampler(seed=3)
    n = 3000
    k2 = [sampler.sample(logits, [SamplingParams(top_k=2)], [0])[0] for _ in range(n)]
    assert set(k2) <= {0, 1}
    assert abs(k2.count(0) / n - 0.5 / 0.8) < 0.04
    p = [sampler.sample(logits, [SamplingParams(top_p=0.7)], [0])[0] for _ in range(n)]
    assert set(p) <= {0, 1}
    full = [sampler.sample(logits, [SamplingParams()], [0])[0] for _ in range(n)]
    assert abs(full.count(2) / n - 0.15) < 0.03


def test_row_count_mismatch_rejected() -> None:
    with pytest.raises(ValueError, match="rows"):
        Sampler().sample(_logits(2), [SamplingParams()], [0, 0])


@settings(max_examples=40, deadline=None)
@given(
    temperature=st.floats(0.0, 3.0),
    top_p=st.floats(0.01, 1.0),
    top_k=st.integers(-1, VOCAB + 5),
    seed=st.one_of(st.none(), st.integers(0, 2**40)),
    index=st.integers(0, 10_000),
)
def test_sampled_token_is_in_the_allowed_set(
    temperature: float, top_p: float, top_k: int, seed: int | None, index: int
) -> None:
    logits = _logits(1, seed=index)
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
    token = Sampler().sample(logits, [params.validate()], [index])[0]
    order = logits[0].argsort(descending=True).tolist()
    if top_k > 0:
        assert order.index(token) < top_k
    if temperature >= 1e-5 and seed is not None:
        assert Sampler().sample(logits, [params], [index])[0] == token


@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=7)],
    ids=["greedy", "seeded"],
)
def test_vocab_limit_cuts_off_the_ids_beyond_it(params: SamplingParams) -> None:
    limit = 20
    logits = _logits(8, seed=4)
    logits[:, limit:] += 100.0  # every id at or above the limit beats every id below it
    assert (logits.argmax(-1) >= limit).all()
    for index in range(10):
        tokens = Sampler(seed=index, vocab_limit=limit).sample(logits, [params] * 8, [index] * 8)
        assert all(0 <= t < limit for t in tokens), tokens
    greedy = Sampler(vocab_limit=limit).sample(
        logits, [SamplingParams(temperature=0.0)] * 8, [0] * 8
    )
    assert greedy == logits[:, :limit].argmax(-1).tolist()
    with pytest.raises(ValueError, match="vocab_limit"):
        Sampler(vocab_limit=0)


def test_hashed_noise_is_exponential_and_keyed() -> None:
    seeds = torch.tensor([0, 1, 2**40 + 3], dtype=torch.int64)
    counters = torch.tensor([0, 0, 5], dtype=torch.int64)
    noise = exponential_from_hash(seeds, counters, 20_000)
    assert noise.shape == (3, 20_000) and bool((noise > 0).all())
    for row in noise:
        assert abs(float(row.mean()) - 1.0) < 0.03 and abs(float(row.std()) - 1.0) < 0.05
    again = exponential_from_hash(seeds[1:2], counters[1:2], 20_000)
    assert torch.equal(again[0], noise[1])
    assert not torch.equal(noise[0], noise[1])
    later = exponential_from_hash(seeds[:1], counters[:1] + 1, 20_000)
    assert not torch.equal(later[0], noise[0])
