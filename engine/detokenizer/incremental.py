"""Incremental detokenization that never splits a multi-byte character.

Two offsets into the request's token ids (as in vLLM and SGLang)::

    ids:  [ ... emitted ... | prefix_offset ... read_offset | new tokens ... ]

``ids[prefix_offset:read_offset]`` is decoded again as context, so that
tokenizers whose pieces depend on their left neighbour decode the new tokens
as they would in the whole text. New text is emitted only when it does not end
in U+FFFD, i.e. when the last character is complete; ``flush`` emits what is
left at the end. Invariant: the concatenation of everything ``push`` and
``flush`` returned equals ``decode(ids)`` of all ids with the same flags.
"""

from __future__ import annotations

from typing import Any

REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    def __init__(self, tokenizer: Any, skip_special_tokens: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0
        self.read_offset = 0

    def decode(self, ids: list[int]) -> str:
        """The text of ``ids``, with the flags this decoder always uses."""
        text = self.tokenizer.decode(
            ids,
            skip_special_tokens=self.skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )
        return str(text)

    def _delta(self) -> tuple[str, str]:
        context = self.decode(self.ids[self.prefix_offset : self.read_offset])
        full = self.decode(self.ids[self.prefix_offset :])
        return context, full

    def push(self, ids: list[int]) -> str:
        """Add tokens; return the new text that is complete (possibly empty)."""
        self.ids.extend(ids)
        context, full = self._delta()
        if len(full) > len(context) and not full.endswith(REPLACEMENT):
            self.prefix_offset = self.read_offset
            self.read_offset = len(self.ids)
            return full[len(context) :]
        return ""

    def flush(self) -> str:
        """The text still held back (an incomplete character at the very end, if any)."""
        context, full = self._delta()
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(context) :]
