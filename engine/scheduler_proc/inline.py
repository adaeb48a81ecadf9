"""``--layout inline``: scheduler rank 0 tokenizes and detokenizes in its own loop.

The same functions as the tokenizer worker's (``engine.tokenizer.worker.tokenize``)
and the detokenizer process's (``engine.detokenizer.process.Detokenizer``), called
between two steps: a request is tokenized as the loop drains its inbox, before
the next step is launched, so a long prompt delays that step for every running
request; a step's tokens become text before the loop goes on.
"""

from __future__ import annotations

import logging

from engine.detokenizer.process import Detokenizer
from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.tokenizer.prompt import PromptError, load_tokenizer
from engine.tokenizer.worker import tokenize

log = logging.getLogger(__name__)


class InlineText:
    """Text in and out of scheduler rank 0: requests to token ids, token items to text items."""

    def __init__(self, cfg: ServeConfig) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.tokenizer_path)
        self.detokenizer = Detokenizer(self.tokenizer)

    def tokenize(
        self, req: messages.GenerateRequest
    ) -> messages.TokenizedRequest | messages.TokenItem:
        """The scheduler's view of ``req``, or an error item saying why its prompt cannot be
        served (it becomes a 400, as a tokenizer worker's rejection does)."""
        try:
            out = tokenize(self.tokenizer, req, self.cfg)
        except PromptError as exc:
            log.info("rid %s rejected: %s", req.rid, exc)
            return messages.TokenItem(rid=req.rid, finish_reason="error", error=str(exc))
        log.debug("rid %s tokenized: %d tokens", req.rid, len(out.input_ids))
        return out

    def detokenize(
        self, items: list[messages.TokenItem]
    ) -> tuple[list[messages.TextItem], list[str]]:
        """The text of ``items``, and the rids whose stop string matched (to abort)."""
        return self.detokenizer.process(messages.TokenBatch(items=items))
