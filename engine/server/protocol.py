"""Request bodies of the HTTP API: every field the OpenAI API defines, with its range.

The models forbid unknown fields and bound every number, so the OpenAPI schema
(``/openapi.json``) says exactly what the server accepts. Bodies are parsed by
hand (JSON, then pydantic) so that a malformed request gets an OpenAI-style
400 naming the offending field, whatever its content type. Fields this server
does not implement are declared too: ``engine.server.translate`` refuses any
value of theirs but the neutral one, naming the field.
"""

from __future__ import annotations

import json
import sys
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from engine.sampling.params import MAX_LOGPROBS
from engine.server.errors import APIError
from engine.server.unicode import not_unicode

INT64_MAX = 2**63 - 1
TOKEN_ID_MAX = 2**31 - 1

TokenId = Annotated[int, Field(ge=0, le=TOKEN_ID_MAX)]
StopString = Annotated[str, Field(min_length=1)]
Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(Body):
    include_usage: bool | None = None
    include_obfuscation: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


class ContentPart(BaseModel):
    """A part of a message's content; only ``text`` parts are served (others are refused)."""

    model_config = ConfigDict(extra="allow")

    type: Literal["text", "image_url", "input_audio", "file", "refusal"]
    text: str | None = None


class ChatMessageIn(Body):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    refusal: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    audio: dict[str, Any] | None = None


class PDFields(Body):
    """Extension: the request is one half of a prefill/decode pair (``engine router
    --prefill ... --decode ...`` sets it): ``room`` names the pair on both servers;
    ``decode`` (to a prefill server) is the decode server's hand-off address."""

    room: Annotated[str, Field(min_length=1, max_length=128)]
    decode: str | None = None


class SamplingFields(Body):
    """Fields shared by chat and text completions: OpenAI's names plus vLLM's common extras
    (``top_k``, ``stop_token_ids``, ``ignore_eos``, ``priority``)."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, Field(ge=-1, le=TOKEN_ID_MAX)] | None = None
    seed: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    stop: StopString | list[StopString] | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool = False
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    priority: Priority = 0
    user: str | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, Annotated[float, Field(ge=-100.0, le=100.0)]] | None = None
    return_meta_info: bool = False  # extension: the stage timestamps of /generate's meta_info
    pd: PDFields | None = None


class ChatCompletionRequest(SamplingFields):
    messages: Annotated[list[ChatMessageIn], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    response_format: ResponseFormat | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None
    function_call: str | dict[str, Any] | None = None
    audio: dict[str, Any] | None = None
    modalities: list[Literal["text", "audio"]] | None = None
    prediction: dict[str, Any] | None = None
    reasoning_effort: Literal["minimal", "low", "medium", "high"] | None = None
    verbosity: Literal["low", "medium", "high"] | None = None
    web_search_options: dict[str, Any] | None = None
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None


PromptIn = (
    Annotated[str, Field(min_length=1)]
    | Annotated[list[TokenId], Field(min_length=1)]
    | Annotated[list[str], Field(min_length=1)]
    | Annotated[list[list[TokenId]], Field(min_length=1)]
)


class CompletionRequest(SamplingFields):
    prompt: PromptIn
    echo: bool = False
    logprobs: Annotated[int, Field(ge=0, le=MAX_LOGPROBS)] | None = None
    best_of: Annotated[int, Field(ge=1, le=128)] | None = None
    suffix: str | None = None


class NativeSamplingParams(Body):
    """``sampling_params`` of ``/generate``, named as ``engine.sampling.SamplingParams``."""

    temperature: Annotated[float, Field(ge=0.0, le=100.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    top_k: Annotated[int, Field(ge=-1, le=TOKEN_ID_MAX)] = -1
    seed: Annotated[int, Field(ge=0, le=INT64_MAX)] | None = None
    max_new_tokens: Annotated[int, Field(ge=1)] | None = None
    stop: list[StopString] = Field(default_factory=list)
    stop_token_ids: list[TokenId] = Field(default_factory=list)
    ignore_eos: bool = False


class GenerateBody(Body):
    """The native ``/generate`` body (SGLang-style): exactly one of ``text`` and ``input_ids``."""

    text: Annotated[str, Field(min_length=1)] | None = None
    input_ids: Annotated[list[TokenId], Field(min_length=1)] | None = None
    sampling_params: NativeSamplingParams = Field(default_factory=NativeSamplingParams)
    stream: bool = False
    priority: Priority = 0
    pd: PDFields | None = None


B = TypeVar("B", bound=Body)

REQUEST_BODIES: tuple[type[Body], ...] = (ChatCompletionRequest, CompletionRequest, GenerateBody)


def parse_body(raw: bytes, model: type[B]) -> B:
    """Parse and validate a JSON body; ``APIError`` 400 with the first problem otherwise.

    Text that is not Unicode (a lone surrogate) is refused by name, never repaired.
    """
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise APIError(f"the body is not valid JSON: {exc}") from None
    except ValueError:  # json reads integers through int(), which bounds their digits
        digits = sys.get_int_max_str_digits()
        raise APIError(f"the body holds a number of more than {digits} digits") from None
    except RecursionError:
        raise APIError("the body is nested too deeply") from None
    if not isinstance(data, dict):
        raise APIError("the body must be a JSON object")
    error = not_unicode(data)
    if error is not None:
        raise error
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = ".".join(str(p) for p in err["loc"]) or None
        if err["type"] == "extra_forbidden":
            raise APIError(
                f"unrecognized request argument: {param}", param=param, code="unknown_parameter"
            ) from None
        raise APIError(f"{param}: {err['msg']}" if param else err["msg"], param=param) from None
