"""What ``--model``, ``--tokenizer`` and ``--dummy-weights`` resolve to, or a clear error.

A model is an HF folder (a known model is converted on first use) or, with
dummy weights only, an architecture preset (``schema.models.PRESETS``).
A preset has no tokenizer, so it borrows one: ``--tokenizer``, by default
``smollm2-135m``; a folder uses its own unless ``--tokenizer`` overrides it.
The tokenizer's folder supplies the chat template and the EOS ids. A borrowed
tokenizer with fewer ids than the model's vocabulary limits sampling to its
ids; one with more (a toy preset) is allowed with dummy weights only, and the
tokenizer workers fold prompt ids into the model's vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from engine.models.setup import ModelNotFoundError, ensure_model, resolve_model
from schema.models import PRESETS, read_eos_token_ids

DEFAULT_TOKENIZER = "smollm2-135m"


@dataclass(frozen=True)
class ModelSource:
    """The model a server runs and the tokenizer it serves it with (see ``ServeConfig``)."""

    model_path: str
    tokenizer_path: Path
    vocab_size: int
    context_len: int
    eos_token_ids: tuple[int, ...]
    vocab_limit: int | None


def folder_shape(folder: Path) -> tuple[int, int]:
    """The vocabulary size and the context length in a folder's ``config.json``."""
    config = json.loads((folder / "config.json").read_text())
    vocab_size = config.get("vocab_size")
    if not isinstance(vocab_size, int):
        raise ValueError(f"{folder}/config.json names no vocab_size")
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        if isinstance(config.get(key), int):
            return vocab_size, int(config[key])
    raise ValueError(f"{folder}/config.json names no context length")


def model_folder(name: str) -> Path:
    """The HF folder of ``name``; the error says what else ``name`` could have been."""
    try:
        return ensure_model(name)
    except ModelNotFoundError as exc:
        if name.lower() in PRESETS:
            raise ModelNotFoundError(
                f"{name!r} is an architecture preset without weights; presets need --dummy-weights"
            ) from None
        raise ModelNotFoundError(
            f"{exc}; or, with --dummy-weights, an architecture preset ({', '.join(PRESETS)})"
        ) from None


def resolve_source(model: str, tokenizer: str | None, dummy_weights: bool) -> ModelSource:
    """The model and tokenizer to serve; ``ModelNotFoundError`` or ``ValueError`` if unfit."""
    preset = PRESETS.get(model.lower()) if dummy_weights else None
    own: Path | None = None
    if preset is not None:
        model_path, vocab_size = model.lower(), preset.vocab_size
        context_len = preset.max_position_embeddings
    else:
        own = model_folder(model)
        model_path = str(own)
        vocab_size, context_len = folder_shape(own)
    if tokenizer is None and own is not None:
        tokenizer_path = own
    else:
        tokenizer_path = resolve_model(tokenizer or DEFAULT_TOKENIZER)
    vocab_limit = None
    if tokenizer_path != own:
        from engine.tokenizer.prompt import load_tokenizer

        num_ids = len(load_tokenizer(str(tokenizer_path)))
        if num_ids > vocab_size and not dummy_weights:
            raise ValueError(
                f"the tokenizer at {tokenizer_path} has {num_ids} ids, more than the model's "
                f"vocabulary of {vocab_size}"
            )
        vocab_limit = num_ids if num_ids < vocab_size else None
    eos_token_ids = read_eos_token_ids(tokenizer_path)
    return ModelSource(
        model_path, tokenizer_path, vocab_size, context_len, eos_token_ids, vocab_limit
    )
