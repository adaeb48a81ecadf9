"""Per-request sampling parameters, shared by the frontend (on the wire) and the sampler."""

from __future__ import annotations

import msgspec

GREEDY_EPS = 1e-5
MAX_LOGPROBS = 20


class SamplingParams(msgspec.Struct, kw_only=True):
    """How to pick each next token and when to stop.

    ``temperature`` 0 is greedy. ``top_k`` -1 (or 0) keeps every token; ``top_p``
    1.0 keeps the whole distribution. With a ``seed``, the token drawn at output
    index ``i`` depends only on (seed, i) and the logits, so runs repeat.
    ``logprobs`` N (None: off) returns the log-probability of each generated
    token and the N most likely ones; ``prompt_logprobs`` N does the same for
    every prompt token (such a request bypasses the prefix cache, whose pages
    carry no logits). Log-probabilities are of the model's distribution, before
    temperature, top-k and top-p.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int | None = None
    max_new_tokens: int = 128
    stop: list[str] = msgspec.field(default_factory=list)
    stop_token_ids: list[int] = msgspec.field(default_factory=list)
    ignore_eos: bool = False
    logprobs: int | None = None
    prompt_logprobs: int | None = None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_EPS or self.top_k == 1

    def validate(self) -> SamplingParams:
        """Raise ``ValueError`` naming the first bad field; return self when all are valid."""
        if not self.temperature >= 0.0 or self.temperature == float("inf"):
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (disabled) or >= 1, got {self.top_k}")
        if self.seed is not None and self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {self.stop!r}")
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            raise ValueError(
                f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
            )
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and not 0 <= value <= MAX_LOGPROBS:
                raise ValueError(f"{name} must be in [0, {MAX_LOGPROBS}], got {value}")
        return self
