"""Speculative decoding, the engine's side: the drafter's settings, and the synthetic
acceptance rule (``synthetic``).

The scheduler core carries drafts in its plans and rolls back what the model
rejects (``core.scheduler``); the runner verifies a draft in one forward pass
(``engine.runner.layout``, ``engine.sampling.verify``).
"""

from engine.speculative.config import DEFAULT_DRAFT_TOKENS, METHODS, SpeculativeConfig

__all__ = ["DEFAULT_DRAFT_TOKENS", "METHODS", "SpeculativeConfig"]
