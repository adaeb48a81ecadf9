"""Incremental detokenization and stop strings, with the real SmolLM2 tokenizer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.detokenizer.incremental import REPLACEMENT, IncrementalDecoder
from engine.detokenizer.process import Detokenizer
from engine.detokenizer.stop import StopMatcher
from engine.ipc import messages
from engine.sampling.logprobs import TokenLogprob

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tokenizer(model_ready: str) -> Any:
    from engine.tokenizer.prompt import load_tokenizer

    return load_tokenizer(model_ready)


@pytest.fixture(scope="module")
def byte_tokens(tokenizer: Any) -> list[int]:
    """Tokens whose bytes are not valid UTF-8 on their own (they split characters)."""
    out = []
    for token_id in range(tokenizer.vocab_size):
        text = tokenizer.decode([token_id])
        if REPLACEMENT in text:
            out.append(token_id)
    assert len(out) > 100
    return out


def full_decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False))


def stream(tokenizer: Any, ids: list[int], cuts: list[int]) -> list[str]:
    """Feed ``ids`` in pieces (sizes from ``cuts``) through the detokenizer; the text pieces."""
    detok = Detokenizer(tokenizer)
    pieces, i, k = [], 0, 0
    while i < len(ids):
        size = max(1, cuts[k % len(cuts)]) if cuts else 1
        k += 1
        chunk = ids[i : i + size]
        i += size
        last = i >= len(ids)
        item = messages.TokenItem(
            rid="r", token_ids=chunk, token_times=[0.0] * len(chunk),
            finish_reason="length" if last else None,
        )  # fmt: skip
        texts, aborts = detok.process(messages.TokenBatch(items=[item]))
        assert not aborts
        pieces += [t.text for t in texts]
    assert not detok.states
    return pieces


def check_streams_like_full_decode(tokenizer: Any, ids: list[int], cuts: list[int]) -> None:
    """The streamed pieces join to the full decode, with no stray replacement character."""
    pieces = stream(tokenizer, ids, cuts)
    full = full_decode(tokenizer, ids)
    assert "".join(pieces) == full
    if REPLACEMENT not in full:
        assert all(REPLACEMENT not in p for p in pieces)


def token_lists(tokenizer_vocab: int, byte_tokens: list[int]) -> st.SearchStrategy[list[int]]:
    any_token = st.integers(0, tokenizer_vocab - 1)
    split = st.sampled_from(byte_tokens)
    return st.lists(st.one_of(any_token, split, split), min_size=1, max_size=40)


def test_streamed_text_concatenates_to_full_decode(tokenizer: Any, byte_tokens: list[int]) -> None:
    @SETTINGS
    @given(
        ids=token_lists(tokenizer.vocab_size, byte_tokens),
        cuts=st.lists(st.integers(1, 4), max_size=5),
    )
    def check(ids: list[int], cuts: list[int]) -> None:
        check_streams_like_full_decode(tokenizer, ids, cuts)

    check()


def test_real_text_with_multibyte_characters_streams_cleanly(tokenizer: Any) -> None:
    @SETTINGS
    @given(text=st.text(min_size=1, max_size=40), cuts=st.lists(st.integers(1, 3), max_size=4))
    def check(text: str, cuts: list[int]) -> None:
        ids = tokenizer.encode(text, add_special_tokens=False)
        if ids:
            check_streams_like_full_decode(tokenizer, ids, cuts)

    check()


def test_a_split_emoji_is_held_until_complete(tokenizer: Any) -> None:
    ids = tokenizer.encode(" 🎉!", add_special_tokens=False)
    decoder = IncrementalDecoder(tokenizer)
    outs = [decoder.push([i]) for i in ids]
    assert len(ids) > 2
    assert outs[0] == ""  # the first byte of the emoji alone is not printable
    assert "".join(outs) + decoder.flush() == " 🎉!"
    assert all(REPLACEMENT not in o for o in outs)


@SETTINGS
@given(
    text=st.text(alphabet="abc é", max_size=30),
    stops=st.lists(st.text(alphabet="abc é", min_size=1, max_size=3), min_size=1, max_size=3),
    cuts=st.lists(st.integers(1, 4), min_size=1, max_size=4),
)
def test_stop_matcher_cuts_at_the_first_completed_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    matcher = StopMatcher(stops)
    out, matched, i, k = "", False, 0, 0
    while i < len(text) and not matched:
        size = cuts[k % len(cuts)]
        k += 1
        piece, matched = matcher.feed(text[i : i + size])
        i += size
        out += piece
    if not matched:
        out += matcher.flush()
    hits = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    if hits:
        assert matched
        assert out == text[: min(hits)[1]]  # cut where the first-completed stop starts
    else:
        assert not matched
        assert out == text


def test_stop_string_finishes_the_request_and_asks_for_an_abort(tokenizer: Any) -> None:
    ids = tokenizer.encode("one two three four five", add_special_tokens=False)
    detok = Detokenizer(tokenizer)
    texts: list[messages.TextItem] = []
    aborts: list[str] = []
    for n, token in enumerate(ids):
        item = messages.TokenItem(
            rid="r", token_ids=[token], token_times=[0.0], stop=[" three"] if n == 0 else None
        )
        t, a = detok.process(messages.TokenBatch(items=[item]))
        texts += t
        aborts += a
    assert aborts == ["r"]
    assert "".join(t.text for t in texts) == "one two"
    assert texts[-1].finish_reason == "stop"
    # tokens still in flight and the scheduler's abort notice are dropped
    late = messages.TokenItem(rid="r", token_ids=[], token_times=[], finish_reason="abort")
    assert detok.process(messages.TokenBatch(items=[late])) == ([], [])


@SETTINGS
@given(cuts=st.lists(st.integers(1, 6), min_size=1, max_size=8), at=st.integers(0, 9))
def test_a_stop_inside_a_many_token_item_keeps_the_tokens_up_to_it(
    tokenizer: Any, cuts: list[int], at: int
) -> None:
    """An item with several tokens (a step that verified a speculative draft) ends where one
    token at a time would: the same text, and only the tokens up to the one completing the
    stop (with their times and log-probs)."""
    words = [
        "alpha",
        "beta",
        "gamma",
        "delta",
        "epsilon",
        "zeta",
        "eta",
        "theta",
        "iota",
        "kappa",
        "lambda",
        "mu",
    ]
    ids = tokenizer.encode(" ".join(words), add_special_tokens=False)
    stop = " " + words[at + 1]

    def run(sizes: list[int]) -> tuple[str, list[int], int]:
        detok = Detokenizer(tokenizer)
        text, kept, i, k = "", [], 0, 0
        while i < len(ids):
            chunk = ids[i : i + sizes[k % len(sizes)]]
            i, k = i + len(chunk), k + 1
            entries = [TokenLogprob(t, -1.0) for t in chunk]
            item = messages.TokenItem(
                rid="r", token_ids=chunk, token_times=[float(i)] * len(chunk),
                logprobs=entries, stop=[stop] if k == 1 else None,
            )  # fmt: skip
            out, aborts = detok.process(messages.TokenBatch(items=[item]))
            for t in out:
                text += t.text
                kept += t.token_ids
                assert len(t.token_times) == len(t.logprobs) == len(t.token_ids)
            if aborts:
                return text, kept, len(out[-1].token_ids)
        raise AssertionError("the stop string never matched")

    one_by_one = run([1])
    text, kept, _ = run(cuts)
    assert (text, kept) == one_by_one[:2]
    assert stop not in text and text.endswith(words[at])
