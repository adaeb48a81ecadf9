"""A request as the scheduler sees it: keys, limits and state, no text and no tensors.

State machine (a request advances when a plan *places* it, not when the plan completes)::

    WAITING ──admit──► PREFILLING ──last chunk placed──► DECODING ──► FINISHED (length | stop)
       ▲                   │                                 │  ▲
       └──── preempted ────┴─────────────────────────────────┘  │ kv_landed
    INCOMING ──admit──► RECEIVING ──────────────────────────────┘   (decode role)
    any state ──abort──► ABORTED (pages released at the next step)

A decode-role scheduler (``core.scheduler.handoff``) takes requests whose KV
a prefill instance computed: such a request waits as INCOMING, is admitted
into RECEIVING (pages reserved, KV in transfer, never placed) and decodes
once its KV landed. A prefill-role scheduler finishes a request after its
first token (``FinishReason.HANDOFF``).

The *fill* of a request is the sequence whose KV must be computed before it can
decode: its prompt plus the tokens it has already generated (non-empty only
after a preemption, which recomputes, and for a request whose KV arrives: its
first token). The last fill chunk samples a token.

Two counts describe progress: ``output`` holds the tokens of completed plans,
``num_planned`` counts the KV positions of every plan made so far, in flight
or completed. Each plan in flight that places a decoding request puts it one
position ahead of its output, plus the draft tokens of its slot (speculative
decoding; only the last slot in flight may carry them); with none they agree.
When a slot with draft tokens completes, ``num_planned`` rolls back to the
positions whose KV holds verified tokens (``core.scheduler.speculative``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING

from core.scheduler.config import SchedulerConfig
from core.scheduler.pages import pages_for
from core.scheduler.radix import PageKey

if TYPE_CHECKING:
    from core.scheduler.radix import RadixNode


class RequestStatus(StrEnum):
    WAITING = "waiting"
    PREFILLING = "prefilling"
    DECODING = "decoding"
    FINISHED = "finished"
    ABORTED = "aborted"
    INCOMING = "incoming"  # decode role: waits for pages for the KV a prefill instance sends
    RECEIVING = "receiving"  # decode role: pages reserved, its KV in transfer


@dataclass(slots=True, eq=False)
class Request:
    """One generation request.

    Prefix-cache keys come from ``prompt`` (token ids, the real engine) or, when
    ``prompt`` is empty, from ``block_hashes`` (one id per ``block_size``-token
    prompt block, as in Mooncake traces). ``prompt_len`` is the prompt length in
    tokens either way. ``priority``: smaller is served first.
    ``expected_output_len`` feeds the ``sjf`` policy (defaults to the limit).
    """

    rid: str
    prompt_len: int
    max_new_tokens: int
    arrival: float = 0.0
    prompt: Sequence[int] = ()
    block_hashes: Sequence[int] = ()
    block_size: int = 512
    priority: int = 0
    expected_output_len: int | None = None
    stop_token_ids: frozenset[int] = frozenset()

    # state, owned by the scheduler
    status: RequestStatus = RequestStatus.WAITING
    output: list[int] = field(default_factory=list)  # tokens of completed plans
    pages: tuple[int, ...] = ()  # the page table: page i holds positions [i * ps, (i + 1) * ps)
    num_planned: int = 0  # KV positions computed by the plans made so far (in flight included)
    num_cached: int = 0  # of those, tokens that came from the prefix cache at admission
    num_shared_pages: int = 0  # leading pages owned by the radix cache, not by this request
    seq: int = 0  # admission order among equal arrivals; set by the scheduler
    admitted_at: int = 0  # the step that last admitted it; earlier plans' slots are stale
    last_plan: int = 0  # the latest step whose plan places it
    draft_in_flight: int = 0  # draft tokens of its slot in flight (the latest); 0 if none
    first_scheduled: float | None = None  # ``now`` of the step that first admitted it
    cache_node: RadixNode | None = None  # the locked radix node of the shared prefix
    _prompt_keys: list[PageKey] | None = field(default=None, repr=False)
    _keys_page_size: int = field(default=0, repr=False)

    @property
    def fill_len(self) -> int:
        """Tokens whose KV must exist before decoding: prompt plus generated output."""
        return self.prompt_len + len(self.output)

    @property
    def planned_outputs(self) -> int:
        """Output tokens that the plans made so far produce (completed ones included).

        Once the last fill chunk is placed, every placed position samples the
        token after it: position ``p`` yields output ``p - prompt_len + 1``.
        """
        if self.status is RequestStatus.DECODING:
            return self.num_planned - self.prompt_len + 1
        return len(self.output)

    @property
    def expected_remaining(self) -> int:
        expected = self.expected_output_len
        if expected is None:
            expected = self.max_new_tokens
        return max(0, expected - len(self.output))

    def page_keys(self, num_pages: int, page_size: int) -> list[PageKey]:
        """Keys of the first ``num_pages`` full pages of the fill, as far as they are known.

        Token mode: a page's key is the tuple of its token ids (prompt, then
        output). Hash mode: ``block_hash * pages_per_block + page index in the
        block``; only prompt pages have keys there. The prompt's keys are
        computed once.
        """
        keys = self._prompt_keys
        if keys is None or self._keys_page_size != page_size:
            keys = self._prompt_keys = self._make_prompt_keys(page_size)
            self._keys_page_size = page_size
        if num_pages <= len(keys):
            return keys[:num_pages]
        if not self.prompt or not self.output:
            return list(keys)
        tokens = list(self.prompt) + self.output
        n = min(num_pages, len(tokens) // page_size)
        extra = [tuple(tokens[i * page_size : (i + 1) * page_size]) for i in range(len(keys), n)]
        return keys + extra

    def _make_prompt_keys(self, page_size: int) -> list[PageKey]:
        if self.prompt:
            tokens = self.prompt
            n = len(tokens) // page_size
            return [tuple(tokens[i * page_size : (i + 1) * page_size]) for i in range(n)]
        if not self.block_hashes:
            return []
        per_block = self.block_size // page_size
        n = min(self.prompt_len // page_size, len(self.block_hashes) * per_block)
        blocks = self.block_hashes[: -(-n // per_block)]
        # page i of block h gets the integer key h * per_block + i: unique, cheap to compare
        keys: list[PageKey] = [h * per_block + i for h in blocks for i in range(per_block)]
        return keys[:n]


class RequestRejected(ValueError):
    """A request that can never be served under this configuration."""


def check_servable(req: Request, config: SchedulerConfig) -> None:
    """Raise ``RequestRejected`` unless ``req`` can be served alone under ``config``."""
    ps = config.page_size
    if req.prompt_len < 1:
        raise RequestRejected(f"request {req.rid}: empty prompt")
    if req.max_new_tokens < 1:
        raise RequestRejected(f"request {req.rid}: max_new_tokens must be >= 1")
    if req.prompt and len(req.prompt) != req.prompt_len:
        raise RequestRejected(
            f"request {req.rid}: prompt_len {req.prompt_len} != len(prompt) {len(req.prompt)}"
        )
    if req.block_hashes and req.block_size % ps:
        raise RequestRejected(
            f"request {req.rid}: block size {req.block_size} is not a multiple of page size {ps}"
        )
    need = pages_for(req.prompt_len + req.max_new_tokens, ps)
    if need > config.pages:
        raise RequestRejected(
            f"request {req.rid}: prompt ({req.prompt_len}) + max_new_tokens "
            f"({req.max_new_tokens}) needs {need} KV pages, the cache has {config.pages}"
        )
