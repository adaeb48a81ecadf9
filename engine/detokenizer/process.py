"""The detokenizer process: ``TokenBatch`` from the scheduler -> ``TextBatch`` to the frontend.

Per request it keeps an ``IncrementalDecoder`` and a ``StopMatcher``. When a
stop string matches, the request finishes here with reason ``stop`` and the
scheduler is told to abort it (freeing its pages); tokens of that request
still in flight are dropped. Items with log-prob entries get the bytes of the
tokens they name, and the decoded prompt when they carry prompt entries.

Invariant: a request's state lives from its first item to its final one
(``finish_reason`` set). The scheduler sends a final item for every request it
drops, an aborted one included (reason ``abort``). Only a request whose
scheduler died gets none: a detokenizer process goes with its replica, and the
frontend's (``--layout frontend``, shared by the replicas) is told to ``forget`` it.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.detokenizer.incremental import IncrementalDecoder
from engine.detokenizer.pieces import TokenPieces
from engine.detokenizer.stop import StopMatcher
from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.ipc.sockets import open_sockets, recv_message, report_ready

log = logging.getLogger(__name__)
MAX_STOPPED = 4096


@dataclass
class DetokState:
    decoder: IncrementalDecoder
    stop: StopMatcher


class Detokenizer:
    """Turns token items into text items; returns the rids the scheduler must abort."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.pieces = TokenPieces(tokenizer)
        self.states: dict[str, DetokState] = {}
        self.stopped: OrderedDict[str, None] = OrderedDict()

    def forget(self, rids: list[str]) -> None:
        """Drop the state of ``rids``: they ended without a final item (their scheduler died)."""
        for rid in rids:
            self.states.pop(rid, None)
            self.stopped.pop(rid, None)

    def process(self, batch: messages.TokenBatch) -> tuple[list[messages.TextItem], list[str]]:
        out: list[messages.TextItem] = []
        aborts: list[str] = []
        for item in batch.items:
            if item.rid in self.stopped:
                if item.finish_reason is not None:
                    del self.stopped[item.rid]
                continue
            text_item = self.process_item(item)
            if text_item.finish_reason == "stop" and item.finish_reason is None:
                aborts.append(item.rid)
                self.stopped[item.rid] = None
                while len(self.stopped) > MAX_STOPPED:
                    self.stopped.popitem(last=False)
            out.append(text_item)
        return out, aborts

    def process_item(self, item: messages.TokenItem) -> messages.TextItem:
        state = self.states.get(item.rid)
        if state is None:
            state = DetokState(IncrementalDecoder(self.tokenizer), StopMatcher(item.stop or []))
            self.states[item.rid] = state
        finish = item.finish_reason
        text, matched, kept = self._feed(state, item.token_ids, flush=finish is not None)
        if matched:
            finish = "stop"
        elif finish is not None:
            text += state.stop.flush()
        if finish is not None:
            del self.states[item.rid]
        output = item.output_fields() | {"finish_reason": finish}
        if kept < len(item.token_ids):  # a stop string ended within the item's tokens
            output |= {name: output[name][:kept] for name in ("token_ids", "token_times")}
            output["logprobs"] = item.logprobs[:kept]
        out = messages.TextItem(
            **output, text=text, error=item.error, error_status=item.error_status
        )
        prompt = item.prompt_logprobs
        if item.logprobs or prompt:
            out.pieces = self.pieces.of(item.logprobs + (prompt or []))
        if prompt is not None:
            out.prompt_text = state.decoder.decode([e.token_id for e in prompt])
        return out

    @staticmethod
    def _feed(state: DetokState, tokens: list[int], flush: bool) -> tuple[str, bool, int]:
        """The text of ``tokens`` that may be emitted, whether a stop string matched, and how
        many of ``tokens`` the output keeps: all, or up to the one that completes the stop (an
        item carries several tokens when a step verified a speculative draft)."""
        if len(tokens) > 1 and state.stop.stops:
            parts = []
            for i, token in enumerate(tokens):
                last = flush and i == len(tokens) - 1
                delta = state.decoder.push([token]) + (state.decoder.flush() if last else "")
                text, matched = state.stop.feed(delta)
                parts.append(text)
                if matched:
                    return "".join(parts), True, i + 1
            return "".join(parts), False, len(tokens)
        delta = state.decoder.push(tokens) if tokens else ""
        if flush:
            delta += state.decoder.flush()
        text, matched = state.stop.feed(delta)
        return text, matched, len(tokens)


def run_detokenizer(cfg: ServeConfig) -> None:
    from engine.tokenizer.prompt import load_tokenizer

    detok = Detokenizer(load_tokenizer(cfg.tokenizer_path))
    ctx, inbox, (to_frontend, to_scheduler) = open_sockets(
        cfg.detokenizer_addr, cfg.frontend_addr, cfg.scheduler_addr
    )
    report_ready(cfg, ctx, "detokenizer", 0)
    while True:
        msg = recv_message(inbox)
        if msg is None:
            continue
        if not isinstance(msg, messages.TokenBatch):
            log.error("unexpected message %s", type(msg).__name__)
            continue
        items, aborts = detok.process(msg)
        for rid in aborts:
            log.info("rid %s matched a stop string; aborting it", rid)
            to_scheduler.send(messages.encode(messages.AbortRequest(rid=rid, reason="stop string")))
        if items:
            to_frontend.send(messages.encode(messages.TextBatch(items=items)))
