"""Sampling parameters (a wire type) and the batched sampler."""

from engine.sampling.params import SamplingParams

__all__ = ["SamplingParams"]
