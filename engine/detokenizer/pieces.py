"""The exact bytes of single tokens, for log-prob entries (``bytes`` and ``token`` in OpenAI's).

Decoding one token alone loses bytes when it holds part of a UTF-8 character.
Byte-level BPE vocabularies (GPT-2 style: Llama 3, Qwen, SmolLM) spell each
byte as one printable character, so a token's bytes are read back through the
inverse of that table; SentencePiece vocabularies spell raw bytes ``<0xNN>``
and spaces ``▁``. Other tokens fall back to their text.
"""

from __future__ import annotations

import re
from typing import Any

from engine.sampling.logprobs import TokenLogprob

SENTENCEPIECE_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-to-character table, inverted: printable bytes stand for themselves, the
    others are shifted to code points 256 and up."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = list(printable)
    shift = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + shift)
            shift += 1
    return {chr(c): b for b, c in zip(printable, chars, strict=True)}


def _uses_byte_level(tokenizer: Any) -> bool:
    """Whether the tokenizer's decoder (or one in its sequence) is byte-level; read from the
    decoder's own JSON (its pickle state), not the whole tokenizer's (a vocabulary's worth)."""
    decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
    if decoder is None:
        return False
    return '"ByteLevel"' in bytes(decoder.__getstate__()).decode()


class TokenPieces:
    """Token id -> its bytes, cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.alphabet = byte_level_alphabet() if _uses_byte_level(tokenizer) else None
        self.cache: dict[int, bytes] = {}

    def piece(self, token_id: int) -> bytes:
        cached = self.cache.get(token_id)
        if cached is None:
            cached = self.cache[token_id] = self._bytes(token_id)
        return cached

    def _bytes(self, token_id: int) -> bytes:
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if not isinstance(token, str):
            return b""
        alphabet = self.alphabet
        if alphabet is not None and all(c in alphabet for c in token):
            return bytes(alphabet[c] for c in token)
        if alphabet is None:
            raw = SENTENCEPIECE_BYTE.fullmatch(token)
            if raw is not None:
                return bytes([int(raw.group(1), 16)])
            return token.replace("\u2581", " ").encode()
        return str(self.tokenizer.decode([token_id])).encode()

    def of(self, entries: list[TokenLogprob]) -> dict[int, bytes]:
        """The bytes of every token ``entries`` name (chosen and alternatives)."""
        ids = {e.token_id for e in entries}
        for e in entries:
            ids.update(e.top_ids)
        return {i: self.piece(i) for i in ids}
