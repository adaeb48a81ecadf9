"""Speculative decoding with the n-gram drafter on the real SmolLM2-135M (CPU, float32).

The serving engine's step loop (``StepDriver``: the real ``Scheduler`` with an
``NgramDrafter``, the real ``ModelRunner``) against the same loop without a
drafter: greedy output must be the same token for token, with drafts of 1 and
4 tokens, with and without overlap scheduling, in batches that mix prefill,
plain decode and verify slots. Then a stop token inside accepted drafts, the
output limit, log-probs and a seeded sampled request, and one end-to-end run
through ``engine serve --speculative ngram``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import running_server
from speculative_loop import PASSAGE, Run, chat_ids, cpu_runner, run, spec_metrics
from tp_helpers import tp_leader
from transformers import AutoTokenizer

from core.scheduler import DecodeSlot, Plan, PrefillChunk, SchedulerConfig
from core.scheduler.drafter import NgramDrafter
from engine.models.setup import ensure_model
from engine.runner import ModelRunner, RunnerArgs, StepInputs
from engine.sampling import SamplingParams
from engine.scheduler_proc.drafts import DraftCounters, accepted_tokens
from engine.scheduler_proc.recorder import StepRecorder
from engine.speculative import DEFAULT_DRAFT_TOKENS, SpeculativeConfig
from schema.steprecord import SPECULATIVE_COLUMNS, STEP_RECORD_COLUMNS, read_step_record
from sim.costs.acceptance import AcceptanceModel

torch.set_num_threads(2)
pytestmark = pytest.mark.slow

NEW_TOKENS = 24
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(ensure_model("smollm2-135m")))


@pytest.fixture(scope="module")
def prompts(tokenizer: Any) -> dict[str, list[int]]:
    return chat_ids(tokenizer)


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    return cpu_runner()


def _greedy(prompts: dict[str, list[int]], **params: Any) -> dict[str, Any]:
    p = SamplingParams(temperature=0.0, max_new_tokens=NEW_TOKENS, **params)
    return {name: (ids, p) for name, ids in prompts.items()}


@pytest.fixture(scope="module")
def plain(runner: ModelRunner, prompts: dict[str, list[int]]) -> Run:
    return run(runner, _greedy(prompts))[0]


@pytest.mark.parametrize("overlap", [False, True], ids=["sequential", "overlap"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_equals_plain_decoding(
    runner: ModelRunner, prompts: dict[str, list[int]], plain: Run, k: int, overlap: bool
) -> None:
    out, driver = run(runner, _greedy(prompts), k, overlap)
    assert out.tokens == plain.tokens
    spec = driver.speculative
    assert spec is not None and spec.verify_slots > 0
    assert 0 < spec.accepted_tokens <= spec.draft_tokens
    assert sum(spec.accepted_lengths) == spec.verify_slots
    assert len(spec.accepted_lengths) <= k + 1
    assert spec.undrafted_slots > 0  # the chat prompts: n-grams rarely match
    assert spec.snapshot().undrafted_slots == spec.undrafted_slots
    assert any(len(tokens) > 1 for tokens in out.per_step), "no step kept an accepted draft"


def test_the_repeating_prompt_accepts_drafts(
    runner: ModelRunner, prompts: dict[str, list[int]], plain: Run
) -> None:
    out, driver = run(runner, _greedy({"repeat": prompts["repeat"]}), 4)
    assert out.tokens["repeat"] == plain.tokens["repeat"]
    spec = driver.speculative
    assert spec is not None
    assert spec.accepted_tokens >= NEW_TOKENS // 3, spec  # copying a passage: most drafts hit
    steps = len(out.per_step)
    assert steps < NEW_TOKENS * 2 // 3, f"{steps} steps for {NEW_TOKENS} tokens"


def test_stop_token_inside_accepted_drafts_ends_the_request(
    runner: ModelRunner, prompts: dict[str, list[int]], plain: Run
) -> None:
    free, _ = run(runner, _greedy({"repeat": prompts["repeat"]}), 4)
    full = free.tokens["repeat"]
    stop = next(  # a token that a step kept inside its accepted drafts, seen there first
        step[i]
        for step in free.per_step
        for i in range(1, len(step) - 1)
        if full.index(step[i]) == full.index(step[0]) + i
    )
    end = full.index(stop) + 1
    out, _ = run(runner, _greedy({"repeat": prompts["repeat"]}, stop_token_ids=[stop]), 4)
    assert out.tokens["repeat"] == plain.tokens["repeat"][:end]
    assert out.finish["repeat"] == "stop"


@pytest.mark.parametrize("limit", [1, 5, 6, 7])
def test_max_tokens_is_honoured_exactly(
    runner: ModelRunner, prompts: dict[str, list[int]], plain: Run, limit: int
) -> None:
    params = SamplingParams(temperature=0.0, max_new_tokens=limit)
    out, _ = run(runner, {"repeat": (prompts["repeat"], params)}, 4)
    assert out.tokens["repeat"] == plain.tokens["repeat"][:limit]
    assert out.finish["repeat"] == "length"


def test_logprobs_one_per_verified_token(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    requests = _greedy({"repeat": prompts["repeat"]}, logprobs=2)
    ref, _ = run(runner, requests)
    out, driver = run(runner, requests, 4)
    assert driver.speculative is not None and driver.speculative.accepted_tokens > 0
    assert out.tokens == ref.tokens
    got, want = out.logprobs["repeat"], ref.logprobs["repeat"]
    assert [e.token_id for e in got] == out.tokens["repeat"]
    assert [e.top_ids for e in got] == [e.top_ids for e in want]
    assert [e.logprob for e in got] == pytest.approx([e.logprob for e in want], abs=1e-4)


def test_a_seeded_sampled_request_draws_the_same_tokens(
    runner: ModelRunner, prompts: dict[str, list[int]]
) -> None:
    """The verifier draws every position with the request's seed at its output index, as
    plain decoding does: the same tokens, accepted drafts or not."""
    params = SamplingParams(temperature=0.7, top_p=0.9, seed=1234, max_new_tokens=NEW_TOKENS)
    requests = {"repeat": (prompts["repeat"], params), "chat1": (prompts["chat1"], params)}
    ref, _ = run(runner, requests)
    out, driver = run(runner, requests, 4)
    assert driver.speculative is not None and driver.speculative.accepted_tokens > 0
    assert out.tokens == ref.tokens


def test_serve_speculative_equals_plain_server() -> None:
    prompt = f"{PASSAGE}\n\nThe same text again:\n\n{PASSAGE[:60]}"
    body = {"model": "smollm2-135m", "prompt": prompt, "max_tokens": 24, "temperature": 0}
    texts = {}
    for args in ((), ("--speculative", "ngram", "--num-draft-tokens", "3")):
        with running_server("--num-pages", "128", *args, cpu_threads=2) as server:
            resp = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120)
            assert resp.status_code == 200, resp.text
            texts[args] = resp.json()["choices"][0]["text"]
            card = httpx.get(f"{server.url}/v1/models", timeout=10).json()["data"][0]
            if not args:
                assert card["speculative"] == {"method": "none"}
                continue
            assert card["speculative"]["method"] == "ngram"
            assert card["speculative"]["num_draft_tokens"] == 3
            metrics = spec_metrics(server)
            assert metrics["engine_spec_decode_num_drafts_total"] > 0
            assert "engine_spec_decode_num_undrafted_slots_total" in metrics
            assert metrics["engine_spec_decode_num_accepted_tokens_total"] > 0
            assert metrics["engine_spec_decode_accepted_length_count"] > 0
            assert "engine_spec_decode_num_tested_tokens_per_pos_total" in metrics
    assert texts[()] and texts[()] == texts[("--speculative", "ngram", "--num-draft-tokens", "3")]


def test_the_step_record_counts_drafts(
    runner: ModelRunner, prompts: dict[str, list[int]], tmp_path: Path
) -> None:
    path = tmp_path / "steps.csv"
    recorder = StepRecorder(path, flush_every=1, speculative=True)
    _, driver = run(runner, _greedy({"repeat": prompts["repeat"]}), 4, recorder=recorder)
    recorder.close()
    steps = read_step_record(path)
    assert tuple(steps.columns) == (*STEP_RECORD_COLUMNS, *SPECULATIVE_COLUMNS)
    spec = driver.speculative
    assert spec is not None and spec.accepted_tokens > 0
    assert int(steps["draft_tokens"].sum()) == spec.draft_tokens
    assert int(steps["accepted_tokens"].sum()) == spec.accepted_tokens
    stats = spec.snapshot()
    assert stats.tested_per_position[0] == stats.verify_slots
    # it checks that each position was tested no less often than passed, no more than reached
    AcceptanceModel.of_histogram(stats.accepted_lengths, tested=stats.tested_per_position)


def test_the_counters_test_each_position_up_to_the_first_rejection() -> None:
    """Drafts of 4, 2 and 3 tokens accepting 1, 2 (all) and 3 (all): positions 0 and 1 of
    the first (1 rejected), 0-1 of the second, 0-2 of the third."""
    counters = DraftCounters()
    slots = (DecodeSlot("a", 9, (0,), (1, 2, 3, 4)), DecodeSlot("b", 9, (1,), (5, 6)),
             DecodeSlot("c", 9, (2,), (7, 8, 9)), DecodeSlot("d", 9, (3,)))  # fmt: skip
    plan = Plan(1, decode=slots)
    accepted = accepted_tokens(plan, {"a": [1, 0], "b": [5, 6, 0], "c": [7, 8, 9, 0], "d": 4})
    assert accepted == [1, 2, 3]
    counters.count(plan, accepted)
    stats = counters.snapshot()
    assert stats.tested_per_position == [3, 3, 1]
    assert stats.accepted_lengths == [0, 1, 1, 1] and stats.undrafted_slots == 1


def test_tensor_parallel_ranks_follow_the_drafts(
    prompts: dict[str, list[int]], tmp_path: Path
) -> None:
    """Two ranks over gloo: the drafts travel in the broadcast plan; with overlap, a verify
    span's first token comes from the samples of the step before, on both ranks."""
    args = RunnerArgs(
        model="smollm2-135m",
        scheduler=SchedulerConfig(num_pages=96),
        dtype="float32",
        tp_size=2,
        dist_init=f"file://{tmp_path / 'rendezvous'}",
    )
    requests = _greedy({name: prompts[name] for name in ("repeat", "chat0")})
    with tp_leader(args) as leader:
        plain, _ = run(leader.runner, requests, launch=leader.launch)
        out, driver = run(leader.runner, requests, 4, True, launch=leader.launch)
    assert out.tokens == plain.tokens
    assert driver.speculative is not None and driver.speculative.accepted_tokens > 0


def test_speculative_settings_are_checked() -> None:
    base = SchedulerConfig(num_pages=8)
    ngram = SpeculativeConfig(method="ngram")
    assert ngram.check(base, k_given=False).num_draft_tokens == DEFAULT_DRAFT_TOKENS
    assert ngram.check(replace(base, num_draft_tokens=2), k_given=True).num_draft_tokens == 2
    with pytest.raises(ValueError, match="needs --num-draft-tokens >= 1"):
        ngram.check(base, k_given=True)
    unused = replace(base, num_draft_tokens=3)  # no drafter: the core drafts nothing
    assert SpeculativeConfig().check(unused, k_given=True) == unused
    with pytest.raises(ValueError, match="--ngram-min 3 and --ngram-max 2"):
        SpeculativeConfig("ngram", ngram_max=2, ngram_min=3).check(base, k_given=False)
    assert SpeculativeConfig().drafter() is None
    assert isinstance(ngram.drafter(), NgramDrafter)


# ---------------------------------------------------------------------------- CUDA
def gpu_only(test: Any) -> Any:
    """Marks ``test`` as one that needs a CUDA device (skipped without one)."""
    needs = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    return pytest.mark.gpu(needs(test))


TIE = 0.05  # bfloat16: kernels that sum in other orders may flip an argmax this close


def _gpu_runner(backend: str, num_draft_tokens: int = 0) -> ModelRunner:
    """Qwen3-0.6B's shape; ``num_draft_tokens`` K > 0 captures verify graphs of 1 + K rows."""
    from engine.attention import ATTENTION_BACKENDS

    if backend not in ATTENTION_BACKENDS:
        pytest.skip(f"needs the {backend} attention backend")
    scheduler = SchedulerConfig(num_pages=256, max_running=8, num_draft_tokens=num_draft_tokens)
    args = RunnerArgs(model="qwen3-0.6b", dummy_weights=True, device="cuda", scheduler=scheduler)
    return ModelRunner(replace(args, attention_backend=backend))


def _verify_plans(prompt: list[int]) -> list[tuple[Plan, StepInputs]]:
    """Teacher-forced steps: two prefills, then verify spans beside a plain decode slot and a
    prefill chunk, then verify spans beside a plain decode slot (drafts of 3 and 1 tokens),
    then verify spans alone, every draft 3 tokens (the shape a verify graph of K = 3 takes)."""
    sp = SamplingParams(temperature=0.0)
    pa, pb, pc = (0, 1, 2, 3, 4, 5), (6, 7, 8), (9, 10, 11)
    a, b = prompt[:70], prompt[70:100]
    d = prompt[100:120]
    return [
        (
            Plan(
                1, prefill=(PrefillChunk("a", 0, 70, True, pa), PrefillChunk("b", 0, 30, True, pb))
            ),
            StepInputs([a, b], [], [sp, sp], [0, 0]),
        ),
        (
            Plan(
                2,
                prefill=(PrefillChunk("c", 0, 20, True, pc),),
                decode=(DecodeSlot("a", 70, pa, tuple(d[1:4])), DecodeSlot("b", 30, pb)),
            ),
            StepInputs([prompt[120:140]], [d[0], d[10]], [sp] * 3, [0, 1, 1]),
        ),
        (
            Plan(
                3,
                decode=(
                    DecodeSlot("b", 31, pb, (d[12],)),
                    DecodeSlot("a", 74, pa, tuple(d[5:8])),
                    DecodeSlot("c", 20, pc),
                ),
            ),
            StepInputs([], [d[11], d[4], d[15]], [sp] * 3, [2, 5, 1]),
        ),
        (
            Plan(
                4,
                decode=(
                    DecodeSlot("b", 33, pb, tuple(d[13:16])),
                    DecodeSlot("a", 78, pa, tuple(d[9:12])),
                    DecodeSlot("c", 21, pc, tuple(d[16:19])),
                ),
            ),
            StepInputs([], [d[12], d[8], d[15]], [sp] * 3, [4, 9, 2]),
        ),
    ]


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@gpu_only
def test_cuda_flashinfer_verify_logits_match_torch_backend(graphs: bool) -> None:
    """FlashInfer lays a verify span out as a prefill chunk (causal over its context): its
    logits match the torch backend's (bfloat16 tolerance), graphs captured or not; with
    graphs, the last two steps replay the verify graph of 1 + 3 rows a slot (4 slots): spans
    of 2 and 4 rows and a plain decode row widened to it, then three spans of 4 rows."""
    runner = _gpu_runner("flashinfer", num_draft_tokens=3)
    if not graphs:
        runner.close()
    reference = _gpu_runner("torch")
    prompt = torch.randint(0, 40000, (200,), generator=torch.Generator().manual_seed(3)).tolist()
    for plan, inputs in _verify_plans(prompt):
        got = runner.logits(plan, inputs)
        want = reference.logits(plan, inputs)
        assert got is not None and want is not None and got.shape == want.shape
        cosine = torch.nn.functional.cosine_similarity(got, want, dim=-1)
        assert bool((cosine > 0.999).all()), (plan.step, cosine.tolist())
        top2 = want.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > TIE
        assert bool(((got.argmax(-1) == want.argmax(-1)) | ~clear).all()), plan.step
    if graphs:
        assert runner.verify_graphs is not None and runner.verify_graphs.replays == 2


@gpu_only
def test_cuda_greedy_speculative_output_equals_plain() -> None:
    """FlashInfer with decode and verify graphs and overlap, as served on CUDA: the same
    greedy tokens with n-gram drafts as without, or a first difference where the two best
    logits tie; the steps that verify drafts replay verify graphs."""
    from test_gpu_engine import _divergence_is_a_tie

    runner = _gpu_runner("flashinfer", num_draft_tokens=4)
    gen = torch.Generator().manual_seed(7)
    prompts = {}
    for i, n in enumerate((12, 25, 40)):
        part = torch.randint(0, 40000, (n,), generator=gen).tolist()
        prompts[f"p{i}"] = part * 3  # repeats: the n-gram drafter has something to find
    params = SamplingParams(temperature=0.0, ignore_eos=True, max_new_tokens=32)
    requests = {name: (ids, params) for name, ids in prompts.items()}
    plain, _ = run(runner, requests, overlap=True)
    out, driver = run(runner, requests, 4, overlap=True)
    assert driver.speculative is not None and driver.speculative.verify_slots > 0
    assert runner.verify_graphs is not None and runner.verify_graphs.replays > 0
    for name, prompt in prompts.items():
        want, got = plain.tokens[name], out.tokens[name]
        assert len(got) == len(want) == 32
        assert _divergence_is_a_tie(runner, prompt, want, got), (name, want, got)
