"""Turn a ``GenerateRequest`` into prompt token ids, or say clearly why not."""

from __future__ import annotations

from typing import Any

from engine.ipc.messages import ChatMessage, GenerateRequest


class PromptError(ValueError):
    """The prompt cannot be served; the message is shown to the client (HTTP 400)."""


def load_tokenizer(model_path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_path)


def chat_prompt(tokenizer: Any, chat: list[ChatMessage]) -> str:
    """The model's chat template applied to ``chat``, ending with the assistant's turn."""
    if not chat:
        raise PromptError("messages must not be empty")
    if not getattr(tokenizer, "chat_template", None):
        raise PromptError("this model has no chat template; use /v1/completions")
    try:
        text = tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in chat],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception as exc:  # the template itself raises on e.g. bad role order
        raise PromptError(f"chat template failed: {exc}") from exc
    if not isinstance(text, str):
        raise PromptError("chat template did not produce text")
    return text


def prompt_ids(tokenizer: Any, req: GenerateRequest, vocab_size: int) -> list[int]:
    """Token ids of the request's prompt (chat messages, text or ids as given)."""
    if req.messages is not None:
        text = chat_prompt(tokenizer, req.messages)
        ids = list(tokenizer.encode(text, add_special_tokens=False))  # the template has them
    elif req.text is not None:
        ids = list(tokenizer.encode(req.text))  # with BOS where the model wants one
    elif req.input_ids is not None:
        ids = list(req.input_ids)
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise PromptError(f"token ids out of range [0, {vocab_size}): {bad[:5]}")
    else:
        raise PromptError("the request has no prompt")
    if not ids:
        raise PromptError("the prompt is empty")
    return ids


def fit_max_tokens(req: GenerateRequest, prompt_len: int, max_model_len: int) -> int:
    """``max_new_tokens`` within the context: an explicit limit that overflows is an error."""
    room = max_model_len - prompt_len
    if room < 1:
        raise PromptError(
            f"the prompt has {prompt_len} tokens; this model's context is {max_model_len} tokens"
        )
    wanted = req.sampling.max_new_tokens
    if wanted <= room:
        return wanted
    if req.max_tokens_explicit:
        raise PromptError(
            f"prompt ({prompt_len} tokens) plus max_tokens ({wanted}) exceeds this model's "
            f"context of {max_model_len} tokens"
        )
    return room
