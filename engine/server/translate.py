"""OpenAI request bodies -> pipeline values, refusing what this server does not implement.

Every field of ``engine.server.protocol`` is either used here or listed in
``UNSUPPORTED`` with the neutral values it accepts; any other value is a 400
that names the field (code ``unsupported_value``), never silently ignored.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from engine.ipc.messages import ChatMessage, PDRoute
from engine.sampling.params import SamplingParams
from engine.server.errors import APIError
from engine.server.protocol import (
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    NativeSamplingParams,
    PDFields,
    SamplingFields,
)

DEFAULT_COMPLETION_TOKENS = 16


def _unset(value: Any) -> bool:
    return not value


# field -> (is the value neutral?, what is accepted), for the fields this server does not implement
UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "frequency_penalty": (_unset, "0"),
    "presence_penalty": (_unset, "0"),
    "logit_bias": (_unset, "{}"),
    "best_of": (lambda v: v in (None, 1), "1"),
    "suffix": (_unset, "an empty string"),
    "response_format": (lambda v: v is None or v.type == "text", '{"type": "text"}'),
    "tools": (_unset, "[]"),
    "tool_choice": (lambda v: v in (None, "none"), '"none"'),
    "functions": (_unset, "[]"),
    "function_call": (lambda v: v in (None, "none"), '"none"'),
    "audio": (lambda v: v is None, "null"),
    "modalities": (lambda v: v in (None, ["text"]), '["text"]'),
    "prediction": (lambda v: v is None, "null"),
    "reasoning_effort": (lambda v: v is None, "null (this model does not reason)"),
    "verbosity": (lambda v: v is None, "null"),
    "web_search_options": (lambda v: v is None, "null"),
    "service_tier": (lambda v: v in (None, "auto", "default"), '"auto" or "default"'),
    "store": (_unset, "false"),
    "metadata": (_unset, "{} (metadata belongs to stored completions)"),
}

MESSAGE_UNSUPPORTED = ("name", "refusal", "tool_calls", "tool_call_id", "function_call", "audio")


def unsupported(param: str, value: Any, accepted: str) -> APIError:
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_none=True)
    return APIError(
        f"{param}={value!r} is not supported by this server; it accepts only {accepted}",
        param=param,
        code="unsupported_value",
    )


def refuse_unsupported(body: BaseModel) -> None:
    """400 for the first field of ``body`` set to a value this server cannot honour."""
    fields = type(body).model_fields
    for name, (neutral, accepted) in UNSUPPORTED.items():
        if name in fields and not neutral(getattr(body, name)):
            raise unsupported(name, getattr(body, name), accepted)
    if isinstance(body, SamplingFields):
        if body.n != 1:
            raise unsupported("n", body.n, "1")
        options = body.stream_options
        if options is not None and not body.stream:
            raise APIError(
                "stream_options is only allowed with stream=true", param="stream_options"
            )
        if options is not None and options.include_obfuscation:
            raise unsupported("stream_options.include_obfuscation", True, "false")


def check_max_tokens(value: int, max_model_len: int, param: str) -> int:
    if value > max_model_len:
        raise APIError(
            f"{param} is {value}; this model's context is {max_model_len} tokens", param=param
        )
    return value


def sampling_params(
    body: SamplingFields,
    max_tokens: int,
    max_model_len: int,
    logprobs: int | None = None,
    prompt_logprobs: int | None = None,
) -> SamplingParams:
    """The ``SamplingParams`` of an OpenAI request (its ranges are checked by the schema)."""
    refuse_unsupported(body)
    check_max_tokens(max_tokens, max_model_len, "max_tokens")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    params = SamplingParams(
        temperature=1.0 if body.temperature is None else body.temperature,
        top_p=1.0 if body.top_p is None else body.top_p,
        top_k=-1 if body.top_k is None else body.top_k,
        seed=body.seed,
        max_new_tokens=max_tokens,
        stop=stop,
        stop_token_ids=list(body.stop_token_ids or []),
        ignore_eos=body.ignore_eos,
        logprobs=logprobs,
        prompt_logprobs=prompt_logprobs,
    )
    return validated(params)


def chat_logprobs_wanted(body: ChatCompletionRequest) -> int | None:
    """Top-n of each generated token (0: only its own log-prob), or None."""
    if body.top_logprobs is not None and not body.logprobs:
        raise APIError("top_logprobs needs logprobs=true", param="top_logprobs")
    if not body.logprobs:
        return None
    return body.top_logprobs or 0


def native_sampling_params(fields: NativeSamplingParams, max_model_len: int) -> SamplingParams:
    """``sampling_params`` of ``/generate``; ``max_new_tokens`` defaults to SamplingParams'."""
    values = fields.model_dump(exclude_none=True)
    if fields.max_new_tokens is not None:
        check_max_tokens(fields.max_new_tokens, max_model_len, "max_new_tokens")
    return validated(SamplingParams(**values))


def validated(params: SamplingParams) -> SamplingParams:
    try:
        return params.validate()
    except ValueError as exc:
        raise APIError(str(exc), param=str(exc).split(" ", 1)[0]) from None


def message_text(message: ChatMessageIn, index: int) -> str:
    where = f"messages.{index}"
    if message.role in ("tool", "function"):
        raise APIError(
            f"{where}.role: {message.role!r} messages are not supported (no tool calling)",
            param=f"{where}.role",
            code="unsupported_value",
        )
    for name in MESSAGE_UNSUPPORTED:
        if getattr(message, name) is not None:
            raise unsupported(f"{where}.{name}", getattr(message, name), "null")
    if message.content is None:
        return ""
    if isinstance(message.content, str):
        return message.content
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise APIError(
                f"{where}.content: parts of type {part.type!r} are not supported (text only)",
                param=f"{where}.content",
                code="unsupported_value",
            )
        parts.append(part.text)
    return "".join(parts)


def chat_messages(body: ChatCompletionRequest) -> list[ChatMessage]:
    """The conversation as the chat template sees it (``developer`` is the ``system`` role)."""
    return [
        ChatMessage(role="system" if m.role == "developer" else m.role, content=message_text(m, i))
        for i, m in enumerate(body.messages)
    ]


def completion_prompt(body: CompletionRequest) -> tuple[str | None, list[int] | None]:
    """The prompt as text or token ids; batches of several prompts are refused."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt, None
    if all(isinstance(p, int) for p in prompt):
        return None, [int(p) for p in prompt]  # type: ignore[arg-type]
    if len(prompt) == 1:
        only = prompt[0]
        if isinstance(only, str):
            if not only:
                raise APIError("prompt must not be empty", param="prompt")
            return only, None
        if isinstance(only, list):
            if not only:
                raise APIError("prompt must not be empty", param="prompt")
            return None, list(only)
    raise APIError(
        "only one prompt per request is supported", param="prompt", code="unsupported_value"
    )


def pd_route(role: str, fields: PDFields | None, params: SamplingParams) -> PDRoute | None:
    """The ``PDRoute`` of a request to a server of ``role``: none for a colocated server, which
    refuses ``pd``; required by a prefill server (with the decode server's address) and a
    decode server, which serve no log-probs (the first token's are the prefill's)."""
    if role == "colocated":
        if fields is not None:
            raise APIError(
                "pd is for a prefill or decode server (engine serve --role prefill|decode); "
                "this one is colocated",
                param="pd",
            )
        return None
    if fields is None:
        raise APIError(
            f"this is a {role} server (--role {role}): it serves only requests of a "
            "prefill/decode pair, which `engine router --prefill URL --decode URL` sends "
            "with a pd field",
            param="pd",
            code="pd_required",
        )
    if role == "prefill" and not fields.decode:
        raise APIError(
            "pd.decode: a prefill server needs the decode server's address", param="pd.decode"
        )
    for name in ("logprobs", "prompt_logprobs"):
        if getattr(params, name) is not None:
            raise APIError(
                f"{name} are not served with prefill/decode disaggregation",
                param=name,
                code="unsupported_value",
            )
    return PDRoute(fields.room, fields.decode or "")
