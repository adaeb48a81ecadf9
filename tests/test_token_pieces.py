"""``engine.detokenizer.pieces``: the exact bytes of single tokens, for byte-level BPE and
SentencePiece-style vocabularies (tokenizers built in memory, and SmolLM2's)."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from engine.detokenizer.pieces import TokenPieces

FAST: Any = PreTrainedTokenizerFast  # its constructor is untyped
VOCAB = {"<unk>": 0, "▁hi": 1, "<0xC3>": 2, "<0xA9>": 3, "a": 4}


def sentencepiece_style() -> Any:
    tok = Tokenizer(models.WordLevel(VOCAB, unk_token="<unk>"))
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    return FAST(tokenizer_object=tok)


def byte_level(decoder: Any) -> Any:
    # "Ã" and "©" spell the bytes 0xC3 and 0xA9 in GPT-2's byte-to-character table
    tok = Tokenizer(models.WordLevel({"<unk>": 0, "Ã": 1, "©": 2, "Ġhi": 3}, unk_token="<unk>"))
    tok.decoder = decoder
    return FAST(tokenizer_object=tok)


def test_sentencepiece_bytes_and_spaces() -> None:
    pieces = TokenPieces(sentencepiece_style())
    assert pieces.alphabet is None
    assert [pieces.piece(i) for i in (1, 2, 3, 4)] == [b" hi", b"\xc3", b"\xa9", b"a"]


def test_byte_level_tokens_give_their_bytes_alone_or_in_a_sequence_decoder() -> None:
    for decoder in (decoders.ByteLevel(), decoders.Sequence([decoders.ByteLevel()])):
        pieces = TokenPieces(byte_level(decoder))
        assert pieces.alphabet is not None
        assert [pieces.piece(i) for i in (1, 2, 3)] == [b"\xc3", b"\xa9", b" hi"]
        assert (pieces.piece(1) + pieces.piece(2)).decode() == "é"


def test_smollm2_splits_a_character_across_tokens(model_ready: str) -> None:
    from engine.tokenizer.prompt import load_tokenizer

    tokenizer = load_tokenizer(model_ready)
    pieces = TokenPieces(tokenizer)
    assert pieces.alphabet is not None
    ids = tokenizer.encode("naïve café 🙂", add_special_tokens=False)
    joined = b"".join(pieces.piece(i) for i in ids)
    assert joined.decode() == "naïve café 🙂"
