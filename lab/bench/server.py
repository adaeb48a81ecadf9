"""What a benchmark learns from the server before it starts: model, context, KV pages.

Any OpenAI-compatible server answers ``GET /v1/models``; this engine's card says
``owned_by: engine`` and adds ``max_model_len``, ``overlap_scheduling``,
``scheduler`` (the core's settings as it runs them), ``dp`` (its replicas),
``gpu_share`` (replicas sharing each GPU), ``router`` (the router core's settings
over them), ``layout`` (where it tokenizes: ``split`` when the card says nothing),
``num_tokenizers`` (its tokenizer workers) and ``record_steps`` (the file its step
record goes to, or null), and its ``/metrics`` gives ``engine_kv_pages_total``.
``engine router`` passes on a worker's card with ``dp`` (its workers), ``workers``
(their URLs: the pages are read from the first one's ``/metrics``), ``router`` and
``shared_frontend`` false (each worker is a server of its own). Only this engine gets
``return_meta_info``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

OURS = "engine"


class ServerError(ValueError):
    """The server cannot be benchmarked (unreachable, no model listed, warm-up failed)."""


@dataclass(frozen=True, slots=True)
class ServerInfo:
    url: str
    model: str
    owned_by: str
    root: str | None
    max_model_len: int | None
    kv_pages_total: int | None
    overlap: bool | None  # overlap scheduling, where the server says
    scheduler: dict[str, Any] | None = None  # the scheduler core's settings, where it says
    dp: int = 1  # data-parallel replicas behind the server
    gpu_share: int = 1  # replicas sharing each GPU (--dp-share-gpu: all of them)
    shared_frontend: bool | None = None  # the replicas share one frontend, where it says
    router: dict[str, Any] | None = None  # the router core's settings over them, where it says
    record_steps: str | None = None  # the file of its step record, where it keeps one
    hardware: str | None = None  # what it runs on, in a profile header's words, where it says
    layout: str = "split"  # where it tokenizes and detokenizes (engine serve --layout)
    num_tokenizers: int | None = None  # its tokenizer workers, where it says
    prefill_workers: int = 0  # behind a prefill/decode router: its prefill servers (dp: decode)

    @property
    def ours(self) -> bool:
        return self.owned_by == OURS


def metric_value(text: str, name: str) -> float | None:
    """The first sample of metric ``name`` in Prometheus text, or None."""
    for line in text.splitlines():
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("{", " "):
            return float(line.rsplit(" ", 1)[1])
    return None


def server_info(url: str, api_key: str | None = None, timeout: float = 30.0) -> ServerInfo:
    url = url.rstrip("/")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        reply = httpx.get(f"{url}/v1/models", headers=headers, timeout=timeout)
        reply.raise_for_status()
        cards = reply.json().get("data") or []
    except (httpx.HTTPError, ValueError) as exc:
        raise ServerError(f"cannot list the models of {url}: {exc}") from None
    if not cards:
        raise ServerError(f"{url}/v1/models lists no model")
    card = cards[0]
    owned_by = str(card.get("owned_by", ""))
    pages = None
    if owned_by == OURS:  # behind engine router: the first worker's pages, as each replica's
        workers = card.get("workers")
        source = str(workers[0]).rstrip("/") if isinstance(workers, list) and workers else url
        try:
            text = httpx.get(f"{source}/metrics", headers=headers, timeout=timeout).text
        except httpx.HTTPError as exc:
            raise ServerError(f"cannot read {source}/metrics: {exc}") from None
        value = metric_value(text, "engine_kv_pages_total")
        pages = int(value) if value else None
    limit = card.get("max_model_len")
    overlap = card.get("overlap_scheduling")
    scheduler = card.get("scheduler")
    dp, router, share = card.get("dp"), card.get("router"), card.get("gpu_share")
    shared = card.get("shared_frontend")
    record = card.get("record_steps")
    hardware = card.get("hardware")
    layout = card.get("layout")
    tokenizers = card.get("num_tokenizers")
    prefill = card.get("prefill_workers") if card.get("role") == "disaggregated" else None
    return ServerInfo(
        url=url,
        model=str(card["id"]),
        owned_by=owned_by,
        root=card.get("root"),
        max_model_len=int(limit) if isinstance(limit, int) else None,
        kv_pages_total=pages,
        overlap=overlap if isinstance(overlap, bool) else None,
        scheduler=scheduler if isinstance(scheduler, dict) else None,
        dp=dp if isinstance(dp, int) and dp >= 1 else 1,
        gpu_share=share if isinstance(share, int) and share >= 1 else 1,
        shared_frontend=shared if isinstance(shared, bool) else None,
        router=router if isinstance(router, dict) else None,
        record_steps=record if isinstance(record, str) else None,
        hardware=hardware if isinstance(hardware, str) and hardware else None,
        layout=layout if isinstance(layout, str) and layout else "split",
        num_tokenizers=tokenizers if isinstance(tokenizers, int) and tokenizers >= 1 else None,
        prefill_workers=len(prefill) if isinstance(prefill, list) else 0,
    )
