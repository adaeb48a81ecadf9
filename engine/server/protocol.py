"""Request bodies of the HTTP API and their translation into pipeline messages.

Bodies are parsed by hand (JSON, then pydantic) so that every malformed
request gets an OpenAI-style 400 naming the offending field.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

import msgspec
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.messages import ChatMessage
from engine.sampling.params import SamplingParams
from engine.server.errors import APIError

DEFAULT_COMPLETION_TOKENS = 16


class Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(Body):
    include_usage: bool = False


class ContentPart(Body):
    type: str
    text: str | None = None


class ChatMessageIn(Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.type != "text" or part.text is None:
                raise APIError(
                    f"content parts of type {part.type!r} are not supported", param="messages"
                )
            parts.append(part.text)
        return "".join(parts)


class SamplingFields(Body):
    """Fields shared by chat and text completions (OpenAI names plus a few extras)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: int = 0
    user: str | None = None
    return_meta_info: bool = False  # extension: the stage timestamps of /generate's meta_info

    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessageIn]
    max_completion_tokens: int | None = None


class CompletionRequest(SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False


class GenerateBody(Body):
    """The native ``/generate`` body (SGLang-style)."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    priority: int = 0


B = TypeVar("B", bound=Body)


def parse_body(raw: bytes, model: type[B]) -> B:
    """Parse and validate a JSON body; ``APIError`` 400 with the first problem otherwise."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise APIError("the body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        raise APIError(f"{param}: {err['msg']}" if param else err["msg"], param=param) from None


def check_max_tokens(value: int, max_model_len: int, param: str) -> int:
    if value < 1:
        raise APIError(f"{param} must be at least 1, got {value}", param=param)
    if value > max_model_len:
        raise APIError(
            f"{param} is {value}; this model's context is {max_model_len} tokens", param=param
        )
    return value


def sampling_params(body: SamplingFields, max_tokens: int, max_model_len: int) -> SamplingParams:
    """The ``SamplingParams`` of an OpenAI request; ``APIError`` for values out of range."""
    if body.n != 1:
        raise APIError("only n=1 is supported", param="n")
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
    )
    if params.temperature > 2.0:
        raise APIError(
            f"temperature must be at most 2, got {params.temperature}", param="temperature"
        )
    return validated(params)


def validated(params: SamplingParams) -> SamplingParams:
    try:
        return params.validate()
    except ValueError as exc:
        raise APIError(str(exc), param=str(exc).split(" ", 1)[0]) from None


def native_sampling_params(fields: dict[str, Any], max_model_len: int) -> SamplingParams:
    """``sampling_params`` of ``/generate``, by ``SamplingParams``' own field names."""
    try:
        params = msgspec.convert(fields, SamplingParams)
    except msgspec.ValidationError as exc:
        raise APIError(f"sampling_params: {exc}", param="sampling_params") from None
    check_max_tokens(params.max_new_tokens, max_model_len, "max_new_tokens")
    return validated(params)


def chat_messages(body: ChatCompletionRequest) -> list[ChatMessage]:
    if not body.messages:
        raise APIError("messages must not be empty", param="messages")
    return [ChatMessage(role=m.role, content=m.text()) for m in body.messages]


def completion_prompt(body: CompletionRequest) -> tuple[str | None, list[int] | None]:
    """The prompt as text or token ids; batches of prompts are refused."""
    prompt = body.prompt
    if isinstance(prompt, str):
        return prompt, None
    if prompt and all(isinstance(p, int) for p in prompt):
        return None, [int(p) for p in prompt]  # type: ignore[arg-type]
    if len(prompt) == 1:
        only = prompt[0]
        if isinstance(only, str):
            return only, None
        if isinstance(only, list):
            return None, list(only)
    if not prompt:
        raise APIError("prompt must not be empty", param="prompt")
    raise APIError("only one prompt per request is supported", param="prompt")
