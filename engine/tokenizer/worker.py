"""A tokenizer worker process: requests in from the frontend, token ids out to the scheduler.

Aborts from the frontend pass through the same worker as their request, so
they reach the scheduler after it. Each request goes to the scheduler of the
replica the frontend named. A dummy-weight model whose vocabulary is
smaller than its borrowed tokenizer sees prompt ids folded into its vocabulary
(id mod vocabulary size): its weights are random, only the shape of the work counts.
"""

from __future__ import annotations

import logging
import time

import msgspec

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.ipc.sockets import open_sockets, recv_message, report_ready
from engine.tokenizer.prompt import PromptError, fit_max_tokens, load_tokenizer, prompt_ids

log = logging.getLogger(__name__)


def run_tokenizer(cfg: ServeConfig, index: int) -> None:
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    replicas = [cfg.scheduler_addr_of(r) for r in range(cfg.dp_size)]
    ctx, inbox, (to_frontend, *to_scheduler) = open_sockets(
        cfg.tokenizer_addr(index), cfg.frontend_addr, *replicas
    )
    report_ready(cfg, ctx, "tokenizer", index)
    log.info("ready: %s", cfg.tokenizer_path)
    while True:
        msg = recv_message(inbox)
        if msg is None:
            continue
        if isinstance(msg, messages.AbortRequest):
            to_scheduler[msg.replica].send(messages.encode(msg))
        elif isinstance(msg, messages.GenerateRequest):
            try:
                out = tokenize(tokenizer, msg, cfg)
            except PromptError as exc:
                log.info("rid %s rejected: %s", msg.rid, exc)
                item = messages.TextItem(rid=msg.rid, text="", error=str(exc))
                to_frontend.send(messages.encode(messages.TextBatch(items=[item])))
                continue
            log.debug("rid %s tokenized: %d tokens", msg.rid, len(out.input_ids))
            to_scheduler[msg.replica].send(messages.encode(out))
        else:
            log.error("unexpected message %s", type(msg).__name__)


def tokenize(
    tokenizer: object, req: messages.GenerateRequest, cfg: ServeConfig
) -> messages.TokenizedRequest:
    """The scheduler's view of ``req``; raises ``PromptError`` for prompts it cannot serve."""
    ids = prompt_ids(tokenizer, req, cfg.vocab_size)
    if cfg.dummy_weights:
        ids = [i % cfg.vocab_size for i in ids]
    max_new = fit_max_tokens(req, len(ids), cfg.max_model_len)
    sampling = msgspec.structs.replace(req.sampling, max_new_tokens=max_new)
    return messages.TokenizedRequest(
        rid=req.rid,
        input_ids=ids,
        sampling=sampling,
        received=req.received,
        tokenized=time.time(),
        priority=req.priority,
        pd=req.pd,
    )
