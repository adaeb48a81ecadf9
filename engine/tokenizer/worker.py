"""A tokenizer worker process: requests in from the frontend, token ids out to the scheduler.

Aborts from the frontend pass through the same worker as their request, so
they reach the scheduler after it.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import msgspec

from engine import messages
from engine.launch.child import open_sockets, recv_message, report_ready
from engine.launch.config import ServeConfig
from engine.tokenizer.prompt import PromptError, fit_max_tokens, load_tokenizer, prompt_ids

log = logging.getLogger(__name__)


def model_vocab_size(model_path: str, tokenizer_len: int) -> int:
    config = json.loads((Path(model_path) / "config.json").read_text())
    return int(config.get("vocab_size") or tokenizer_len)


def run_tokenizer(cfg: ServeConfig, index: int) -> None:
    tokenizer = load_tokenizer(cfg.model_path)
    vocab_size = model_vocab_size(cfg.model_path, len(tokenizer))
    ctx, inbox, (to_scheduler, to_frontend) = open_sockets(
        cfg.tokenizer_addr(index), cfg.scheduler_addr, cfg.frontend_addr
    )
    report_ready(cfg, ctx, "tokenizer", index)
    log.info("ready: %s", cfg.model_path)
    while True:
        msg = recv_message(inbox)
        if msg is None:
            continue
        if isinstance(msg, messages.AbortRequest):
            to_scheduler.send(messages.encode(msg))
        elif isinstance(msg, messages.GenerateRequest):
            try:
                out = tokenize(tokenizer, msg, vocab_size, cfg.max_model_len)
            except PromptError as exc:
                log.info("rid %s rejected: %s", msg.rid, exc)
                item = messages.TextItem(rid=msg.rid, text="", error=str(exc))
                to_frontend.send(messages.encode(messages.TextBatch(items=[item])))
                continue
            log.debug("rid %s tokenized: %d tokens", msg.rid, len(out.input_ids))
            to_scheduler.send(messages.encode(out))
        else:
            log.error("unexpected message %s", type(msg).__name__)


def tokenize(
    tokenizer: object, req: messages.GenerateRequest, vocab_size: int, max_model_len: int
) -> messages.TokenizedRequest:
    """The scheduler's view of ``req``; raises ``PromptError`` for prompts it cannot serve."""
    ids = prompt_ids(tokenizer, req, vocab_size)
    max_new = fit_max_tokens(req, len(ids), max_model_len)
    sampling = msgspec.structs.replace(req.sampling, max_new_tokens=max_new)
    return messages.TokenizedRequest(
        rid=req.rid,
        input_ids=ids,
        sampling=sampling,
        received=req.received,
        tokenized=time.time(),
        priority=req.priority,
    )
