"""Speculative decoding's verification rule (``engine.sampling.verify``) on synthetic logits.

The rule must leave the output distribution the target's: the first verified
token of a slot is distributed as the target's processed distribution at the
slot's first position (temperature, top-k, top-p), and, given that the draft's
first token was accepted, the next one as the target's at the second position.
Each check bounds every token's empirical frequency by Hoeffding's inequality
with a union over the vocabulary: a correct rule fails it with probability
below ``DELTA`` for any seed (the seeds are fixed, so the test is deterministic),
and a rule off by a few percent in any token's probability fails it.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from engine.sampling import SamplingParams
from engine.sampling.sampler import Sampler, SamplingArrays
from engine.sampling.verify import expand_rows, group_tokens, kept_rows, verify_draft

torch.set_num_threads(1)
VOCAB = 8
SAMPLES = 20_000
DELTA = 1e-6  # the chance that a correct rule fails one check
PARAMS = SamplingParams(temperature=0.9, top_k=6, top_p=0.95)


def test_verify_keeps_the_accepted_prefix_and_the_next_token() -> None:
    assert verify_draft([5], []) == [5]
    assert verify_draft([7, 1, 2], [3, 1]) == [7]  # first rejected: the correction
    assert verify_draft([3, 9, 2], [3, 1]) == [3, 9]
    assert verify_draft([3, 1, 2], [3, 1]) == [3, 1, 2]  # all accepted: the bonus token
    with pytest.raises(ValueError, match="sampled tokens"):
        verify_draft([3, 1], [3, 1])


def test_rows_of_a_step_group_per_request() -> None:
    drafts = [(), (4, 5), (), (6,)]
    flat = [10, 4, 9, 8, 11, 6, 12]
    tokens = group_tokens(flat, drafts)
    assert tokens == [10, [4, 9], 11, [6, 12]]
    assert kept_rows(drafts, tokens) == [[0], [1, 2], [4], [5, 6]]
    params, index = expand_rows([PARAMS] * 4, [0, 3, 7, 1], drafts)
    assert index == [0, 3, 4, 5, 7, 1, 2] and len(params) == 7


def _target(logits: torch.Tensor, params: SamplingParams) -> np.ndarray:
    """The processed distribution, computed apart from the sampler: temperature, then the
    top-k logits, then the smallest prefix (by probability) whose mass before the last
    token kept is at most top-p."""
    scaled = logits.double().numpy() / params.temperature
    order = np.argsort(-scaled, kind="stable")
    keep = np.zeros(VOCAB, dtype=bool)
    keep[order[: params.top_k]] = True
    probs = np.where(keep, np.exp(scaled - scaled.max()), 0.0)
    probs /= probs.sum()
    before = np.cumsum(probs[order]) - probs[order]
    drop = order[before > params.top_p]
    probs[drop] = 0.0
    return np.asarray(probs / probs.sum())


def _bound(n: int) -> float:
    """Every token's frequency in ``n`` draws is within this of its probability, but with
    probability below ``DELTA`` (Hoeffding, a union over the vocabulary)."""
    return math.sqrt(math.log(2 * VOCAB / DELTA) / (2 * n))


def _assert_distributed(tokens: np.ndarray, probs: np.ndarray) -> None:
    assert not np.isin(tokens, np.flatnonzero(probs == 0)).any(), "drew a filtered-out token"
    freq = np.bincount(tokens, minlength=VOCAB) / len(tokens)
    gap = float(np.abs(freq - probs).max())
    assert gap <= _bound(len(tokens)), (gap, freq.round(3), probs.round(3))


def _slot_logits() -> torch.Tensor:
    """The target's logits at a slot's two positions (its token, then its one draft token)."""
    return torch.tensor([
        [2.0, 1.6, 0.1, -0.5, 1.2, -3.0, 0.4, -1.0],
        [0.3, -0.2, 1.5, 0.9, -1.0, 0.0, 1.1, -2.5],
    ])  # fmt: skip


def _draws(seeded: bool, counter_offset: int = 0) -> np.ndarray:
    """``SAMPLES`` slots' sampled rows ``[SAMPLES, 2]``, as the runner draws them: one request
    per slot (seed i, or the sampler's generator), rows at output indices 0 and 1."""
    logits = _slot_logits().repeat(SAMPLES, 1)
    params = [
        SamplingParams(temperature=0.9, top_k=6, top_p=0.95, seed=i if seeded else None)
        for i in range(SAMPLES)
    ]
    rows, index = expand_rows(params, [counter_offset] * SAMPLES, [(0,)] * SAMPLES)
    arrays = SamplingArrays.build(rows, index, VOCAB)
    device = [torch.from_numpy(a) for a in arrays.host_arrays()]
    sampled = Sampler(seed=3).sample_tensor(logits, arrays.with_arrays(device))
    return sampled.view(SAMPLES, 2).numpy()


@pytest.mark.parametrize("seeded", [True, False])
@pytest.mark.parametrize("draft", [0, 1, 4])
def test_verified_tokens_follow_the_target_distribution(seeded: bool, draft: int) -> None:
    p0, p1 = (_target(row, PARAMS) for row in _slot_logits())
    assert 0.05 < p0[draft] < 0.95  # the draft is accepted sometimes and rejected sometimes
    sampled = _draws(seeded)
    verified = group_tokens(sampled.reshape(-1).tolist(), [(draft,)] * SAMPLES)
    first = np.array([v[0] for v in verified if isinstance(v, list)])
    _assert_distributed(first, p0)
    second = np.array([v[1] for v in verified if isinstance(v, list) and len(v) == 2])
    assert len(second) == int((first == draft).sum())  # a bonus token after each acceptance
    _assert_distributed(second, p1)


def _wrong_rule(sampled: np.ndarray, other: np.ndarray, draft: int) -> np.ndarray:
    """Accept the draft with probability p(d), as the rule does, but on a rejection draw the
    correction from p itself (``other``: independent draws), not from p without d."""
    return np.where(sampled[:, 0] == draft, draft, other[:, 0])


def test_the_check_catches_a_wrong_rule() -> None:
    draft = 1
    p0 = _target(_slot_logits()[0], PARAMS)
    sampled, other = _draws(seeded=True), _draws(seeded=True, counter_offset=2)
    _assert_distributed(sampled[:, 0], p0)  # the draws themselves are right
    wrong = _wrong_rule(sampled, other, draft)  # p(d) + (1 - p(d)) p(d) for the draft
    with pytest.raises(AssertionError):
        _assert_distributed(wrong, p0)
    always = np.full(SAMPLES, draft)  # accepting every draft
    with pytest.raises(AssertionError):
        _assert_distributed(always, p0)


def test_greedy_verification_is_the_argmax_prefix() -> None:
    logits = torch.randn(5, VOCAB, generator=torch.Generator().manual_seed(1))
    greedy = logits.argmax(-1).tolist()
    params, index = expand_rows([SamplingParams(temperature=0.0)], [0], [tuple(greedy[:4])])
    sampled = Sampler().sample(logits, params, index)
    assert group_tokens(sampled, [tuple(greedy[:4])]) == [greedy]
    draft = (greedy[0], (greedy[1] + 1) % VOCAB, greedy[2], greedy[3])
    assert group_tokens(sampled, [draft]) == [greedy[:2]]


def test_a_seeded_request_draws_what_plain_decoding_draws() -> None:
    """Row ``j`` of a slot draws output index ``first + j`` with the request's seed: the
    tokens plain decoding draws one step at a time from the same logits."""
    logits = torch.randn(4, VOCAB, generator=torch.Generator().manual_seed(2)) * 2
    params = SamplingParams(temperature=1.1, seed=42)
    sampler = Sampler()
    plain = [sampler.sample(logits[j : j + 1], [params], [7 + j])[0] for j in range(4)]
    rows, index = expand_rows([params], [7], [tuple(plain[:3])])
    assert group_tokens(sampler.sample(logits, rows, index), [tuple(plain[:3])]) == [plain]
