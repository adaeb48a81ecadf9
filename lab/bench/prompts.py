"""Prompt texts of exact token lengths whose shared prefixes follow a trace's ``hash_ids``.

A prompt is a run of words that are one token each with their leading space
(``" the"``, ``" house"``), so N words are N tokens for the tokenizer they
were picked from, and words never merge across a boundary. Block ``h`` of a
trace (512 tokens, Mooncake's ``hash_ids``) is always the same word sequence
(seeded by ``h``), so requests that share blocks share a token prefix and hit
the server's prefix cache where the trace says they would. Tokens a trace
request has beyond its blocks, and every token of a request without blocks,
are drawn from the request's own seed. Special tokens the tokenizer adds on
its own (a BOS) are counted in the length.

Every seed starts with the maker's ``salt``: runs with different salts share no
prompt text, so a run never finds the prompts of an earlier run in the
server's prefix cache (``engine bench`` draws a fresh salt per run). Warm-up
prompts are drawn from seeds of their own (``warmup N``), which no block or
request seed uses, so the warm-up leaves nothing in the cache that a measured
request could hit.
"""

from __future__ import annotations

import random
import re
from typing import Any

from schema.traces.record import HASH_BLOCK_TOKENS, TraceRequest

MAX_WORDS = 4096
WORD = re.compile(r" [a-z]{2,}")


class PromptMaker:
    def __init__(self, tokenizer: Any, salt: str = "") -> None:
        self.salt = salt
        self.words = one_token_words(tokenizer)
        if len(self.words) < 256:
            raise ValueError(
                f"the tokenizer has only {len(self.words)} one-token words; cannot build prompts"
            )
        plain = tokenizer.encode("a", add_special_tokens=False)
        self.added = len(tokenizer.encode("a")) - len(plain)
        self._blocks: dict[int, list[str]] = {}

    def _draw(self, seed: str, n: int) -> list[str]:
        return random.Random(self.salt + seed).choices(self.words, k=n)

    def block(self, h: int) -> list[str]:
        words = self._blocks.get(h)
        if words is None:
            words = self._blocks[h] = self._draw(f"block {h}", HASH_BLOCK_TOKENS)
        return words

    def text(self, req: TraceRequest) -> str:
        """The prompt of ``req``: ``input_length`` tokens (at least one word)."""
        need = max(req.input_length - self.added, 1)
        words: list[str] = []
        for i, h in enumerate(req.hash_ids):
            take = min(HASH_BLOCK_TOKENS - (self.added if i == 0 else 0), need - len(words))
            if take <= 0:
                break
            words += self.block(h)[:take]
        if len(words) < need:
            words += self._draw(f"request {req.rid}", need - len(words))
        return "".join(words)

    def warmup_text(self, index: int, length: int) -> str:
        """Warm-up prompt ``index``: ``length`` tokens (at least one word) that share no
        prefix with any measured prompt of this maker."""
        return "".join(self._draw(f"warmup {index}", max(length - self.added, 1)))


def one_token_words(tokenizer: Any) -> list[str]:
    """Up to ``MAX_WORDS`` words (space + lowercase letters) that encode to one token."""
    words: list[str] = []
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if WORD.fullmatch(text) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.append(text)
            if len(words) == MAX_WORDS:
                break
    return words


def fresh_salt() -> str:
    """A salt no earlier run used (random), for ``PromptMaker``."""
    return f"{random.SystemRandom().getrandbits(64):016x} "
