"""Tokenizer workers: chat template, text -> token ids, prompt limits."""
