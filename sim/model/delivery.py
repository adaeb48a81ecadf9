"""Token delivery: each step's tokens travel GPU -> IPC -> detokenizer -> IPC -> frontend (SSE).

Nothing on this path feeds back into scheduling, so the pipeline only records,
for each step that produced tokens, when it ended and which requests got a
token (one step, or a fast-forwarded run of identical steps); ``flush()`` then
times the steps recorded so far at once through the detokenizer's FIFO queue
(carried over from the previous flush, ``sim.model.detokenizer.Fifo``) and
derives each request's client-side times:

- a step's message arrives at ``end + ipc``, departs the detokenizer at
  ``depart``, reaches the frontend at ``depart + ipc`` and the client when the
  frontend has streamed it (a second FIFO queue, ``stream`` seconds per token;
  with no streaming cost, at ``depart + ipc``);
- a request's tokens form chunk groups (one step, or a run of steps), in time
  order; its output tokens are the steps it appears in, its ITL gaps are the
  gaps between consecutive chunks, and its detokenize time sums its steps'
  ``depart - arrive``.

A step that verified a draft (speculative decoding) gives a request several
tokens in one chunk, as the engine sends them in one message: each extra
token adds to the request's output tokens and to the detokenizer's work, not
to the chunks streamed nor to the ITL gaps.

What a request gathers over flushes sits in ``RequestTotals``, shared by the
replicas of a cluster. Flushing every few steps or once at the end gives the
same floats: the queues carry their state, a block is never split, and the
per-request sums add in block order either way.

That is the ``split`` layout. In the ``frontend`` layout a step's message goes
one hop to the frontend's process, which detokenizes and streams it: one FIFO
queue of ``detokenize + stream`` seconds a token. In the ``inline`` layout the
scheduler's loop detokenized the step before its tokens left (its time is in
the step's end, ``sim.model.scheduler_loop``): the text goes one hop to the
frontend, which streams it.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from schema.samples import WeightedSamples
from schema.spill import SpilledSamples
from sim.model.detokenizer import Fifo, serve_fifo


class RequestTotals:
    """Per request (by index): output tokens, detokenize time, and when its latest chunk
    reached the client; and the pooled ITL gaps of all requests (on disk)."""

    def __init__(self, num_requests: int) -> None:
        self.output_tokens = np.zeros(num_requests, dtype=np.int64)
        self.detokenize_s = np.zeros(num_requests)
        self.last_client = np.full(num_requests, np.nan)
        self.itl_s = SpilledSamples()


@dataclass(frozen=True, slots=True)
class DeliveredChunk:
    """Steps ``first_step ..`` of a delivery, timed: when each step ended on the server
    (the server's time of its tokens), when its chunk reached the client, and the requests
    each block served (block after block)."""

    first_step: int
    server: np.ndarray
    client: np.ndarray
    members: np.ndarray


class TokenDelivery:
    """Records token-carrying steps during a replay; ``flush()`` times those recorded so far."""

    def __init__(
        self,
        totals: RequestTotals,
        ipc: float,
        detokenize_per_token: float,
        stream_per_token: float = 0.0,
        layout: str = "split",
    ) -> None:
        self.totals = totals
        self.layout = layout
        self.ipc = ipc
        self.detokenize_per_token = detokenize_per_token
        self.stream_per_token = stream_per_token
        self.num_steps = 0
        self.delivered_steps = 0
        self.detokenizer = Fifo()
        self.frontend = Fifo(keep_queue=False)
        self._clear()

    def _clear(self) -> None:
        self._ends = array("d")  # per step: when it ended
        self._lengths = array("q")  # per block (a step, or a run of steps): its steps
        self._batch = array("q")  # per block: requests that get a token each step
        self._members = array("q")  # request indices, block after block
        self._extra_steps = array("q")  # per extra token of a chunk: its step (since the flush)
        self._extra_members = array("q")  # and its request

    @property
    def pending(self) -> int:
        """Steps recorded and not yet flushed."""
        return self.num_steps - self.delivered_steps

    def step(self, end: float, members: list[int], extra: list[int] | None = None) -> int:
        """One step that gave a chunk to each of ``members``: one token, and one more for each
        time a member is in ``extra`` (verified drafts); returns its step number."""
        g = self.num_steps
        self._ends.append(end)
        self._lengths.append(1)
        self._batch.append(len(members))
        self._members.extend(members)
        if extra:
            self._extra_steps.extend([g - self.delivered_steps] * len(extra))
            self._extra_members.extend(extra)
        self.num_steps = g + 1
        return g

    def run(self, ends: np.ndarray, members: list[int]) -> None:
        """``len(ends)`` consecutive steps, each giving one token to each of ``members``."""
        self._ends.frombytes(ends.astype(np.float64, copy=False).tobytes())
        self._lengths.append(len(ends))
        self._batch.append(len(members))
        self._members.extend(members)
        self.num_steps += len(ends)

    def flush(self) -> DeliveredChunk:
        """Time the steps recorded since the last flush (see the module docstring), add to
        the requests' totals, and let the records go."""
        if not self._lengths:
            empty = np.zeros(0)
            return DeliveredChunk(self.delivered_steps, empty, empty, np.zeros(0, np.int64))
        t = self.totals
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        batch = np.frombuffer(self._batch, dtype=np.int64)
        server = np.frombuffer(self._ends, dtype=np.float64).copy()
        per_step = np.repeat(batch, lengths)  # chunks
        tokens = per_step
        extra = np.frombuffer(self._extra_members, dtype=np.int64)
        if len(extra):
            tokens = per_step.copy()
            np.add.at(tokens, np.frombuffer(self._extra_steps, dtype=np.int64), 1)
        detok, client = self._to_client(server, tokens, per_step)
        del per_step, tokens
        first = np.cumsum(lengths) - lengths  # first step of each block
        block_detok = np.add.reduceat(detok, first) if len(detok) else np.zeros(0)
        del detok
        # one chunk group per (block, member): request g_req has steps [g_first, g_last]
        g_req = np.frombuffer(self._members, dtype=np.int64).copy()
        np.add.at(t.output_tokens, g_req, np.repeat(lengths, batch))
        if len(extra):
            np.add.at(t.output_tokens, extra, 1)
        np.add.at(t.detokenize_s, g_req, np.repeat(block_detok, batch))  # in block order
        g_first = np.repeat(first, batch)
        g_last = np.repeat(first + lengths - 1, batch)
        between = self._gaps_between(client, g_req, g_first, g_last)
        del g_first, g_last
        t.itl_s.add(between, np.ones(len(between), np.int64))
        within = self._gaps_within(client, first, lengths, batch)
        t.itl_s.add(within.values, within.counts)
        chunk = DeliveredChunk(self.delivered_steps, server, client, g_req)
        self.delivered_steps = self.num_steps
        self._clear()
        return chunk

    def _to_client(
        self, server: np.ndarray, tokens: np.ndarray, chunks: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per step (``tokens`` in ``chunks`` each, leaving the engine at ``server``): its time
        in detokenization, and when its chunks reach the client (module docstring)."""
        ipc, detokenize, stream = self.ipc, self.detokenize_per_token, self.stream_per_token
        if self.layout == "frontend":
            arrive = server + ipc
            # (one token a chunk: the same floats as before drafts existed)
            same = tokens is chunks
            work = chunks * (detokenize + stream) if same else tokens * detokenize + chunks * stream
            client = serve_fifo(arrive, work, self.detokenizer)
            return client - arrive, client
        if self.layout == "inline":
            detok, client = tokens * detokenize, server + ipc
        else:
            arrive = server + ipc
            depart = serve_fifo(arrive, tokens * detokenize, self.detokenizer)
            detok = np.subtract(depart, arrive, out=arrive)
            client = np.add(depart, ipc, out=depart)
        if stream > 0:
            client = serve_fifo(client, chunks * stream, self.frontend)
        return detok, client

    def _gaps_between(
        self, client: np.ndarray, g_req: np.ndarray, g_first: np.ndarray, g_last: np.ndarray
    ) -> np.ndarray:
        """Gaps between each request's consecutive chunk groups (recorded in time order), the
        first against its latest group of an earlier flush; moves ``last_client`` on."""
        last_client = self.totals.last_client
        order = np.argsort(g_req, kind="stable")
        req = g_req[order]
        same = req[1:] == req[:-1]
        head = np.concatenate(([True], ~same))  # each request's first group here
        tail = np.concatenate((~same, [True]))  # and its last
        earlier = last_client[req[head]]
        seen = ~np.isnan(earlier)
        first_gaps = client[g_first[order[head][seen]]] - earlier[seen]
        after = g_first[order[1:][same]]
        before = g_last[order[:-1][same]]
        last_client[req[tail]] = client[g_last[order[tail]]]
        return np.concatenate([first_gaps, client[after] - client[before]])

    @staticmethod
    def _gaps_within(
        client: np.ndarray, first: np.ndarray, lengths: np.ndarray, batch: np.ndarray
    ) -> WeightedSamples:
        """The step gaps inside each run, once per request of the run."""
        weight = np.repeat(np.where(lengths >= 2, batch, 0).astype(np.int64), lengths)
        if len(weight):
            weight[first + lengths - 1] = 0  # from a block's last step on is not inside it
        inside = np.flatnonzero(weight[:-1])
        return WeightedSamples(client[inside + 1] - client[inside], weight[inside])
