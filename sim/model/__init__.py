"""The simulated pipeline: SimPy processes for the frontend, tokenizers, the scheduler loop,
detokenizer and streaming, around the shared scheduler core."""
