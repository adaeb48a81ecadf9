"""One builder of the router's requests: ``engine router`` and ``engine serve --dp`` key a prompt
alike, so a chat placed by either lands on the same prefix."""

from __future__ import annotations

from core.router import RouteRequest
from core.router.prompt_key import CHARS_PER_TOKEN, route_request
from engine.ipc.messages import ChatMessage, GenerateRequest
from engine.router.keys import body_route
from engine.sampling.params import SamplingParams
from engine.server.replicas import prompt_text

CHAT = [("system", "You answer briefly."), ("user", "What is a KV cache? " * 4)]


def frontend_route(req: GenerateRequest) -> RouteRequest:
    return route_request(
        req.rid, prompt_text(req), req.input_ids, req.sampling.max_new_tokens, req.session
    )


def test_a_chat_gets_the_same_key_from_the_router_and_the_frontend() -> None:
    body = {
        "messages": [{"role": r, "content": c} for r, c in CHAT],
        "max_tokens": 9,
        "user": "u1",
    }
    by_router = body_route("r1", body)
    request = GenerateRequest(
        sampling=SamplingParams(max_new_tokens=9),
        rid="r1",
        messages=[ChatMessage(r, c) for r, c in CHAT],
        session="u1",
    )
    by_frontend = frontend_route(request)
    assert by_router == by_frontend
    text = "".join(f"{r}\n{c}\n" for r, c in CHAT)
    assert by_router.input_tokens == len(text) // CHARS_PER_TOKEN
    assert (by_router.output_tokens, by_router.session) == (9, "u1")


def test_token_ids_and_text_prompts_agree_too() -> None:
    ids = GenerateRequest(sampling=SamplingParams(max_new_tokens=3), rid="a", input_ids=[5, 6, 7])
    assert frontend_route(ids) == body_route("a", {"input_ids": [5, 6, 7], "max_new_tokens": 3})
    text = GenerateRequest(sampling=SamplingParams(max_new_tokens=4), rid="b", text="hello " * 9)
    assert frontend_route(text) == body_route("b", {"prompt": "hello " * 9, "max_tokens": 4})
