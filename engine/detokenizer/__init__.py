"""The detokenizer process: token ids -> UTF-8-safe incremental text, stop strings."""
