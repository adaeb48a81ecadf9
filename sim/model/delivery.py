"""Token delivery: each step's tokens travel GPU -> IPC -> detokenizer -> IPC -> frontend (SSE).

Nothing on this path feeds back into scheduling, so the pipeline only records,
for each step that produced tokens, when it ended and which requests got a
token (one step, or a fast-forwarded run of identical steps); ``deliver()``
then times every step at once through the detokenizer's FIFO queue and derives
each request's client-side times:

- a step's message arrives at ``end + ipc``, departs the detokenizer at
  ``depart``, reaches the frontend at ``depart + ipc`` and the client when the
  frontend has streamed it (a second FIFO queue, ``stream`` seconds per token;
  with no streaming cost, at ``depart + ipc``);
- a request's tokens form chunk groups (one step, or a run of steps), in time
  order; its output tokens are the steps it appears in, its ITL gaps are the
  gaps between consecutive chunks, and its detokenize time sums its steps'
  ``depart - arrive``.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

import numpy as np

from schema.samples import WeightedSamples
from sim.model.detokenizer import serve_fifo


@dataclass(frozen=True, slots=True)
class Delivered:
    """The timed deliveries: per step (in step order) and per request (by index)."""

    client: np.ndarray  # per step: when its chunk reached the client
    output_tokens: np.ndarray  # per request
    detokenize_s: np.ndarray  # per request: time in the detokenizer, queue and service
    itl_s: WeightedSamples  # pooled gaps between consecutive chunks of each request
    queue_times: np.ndarray  # the detokenizer's queue (messages waiting) at each change
    queue_lengths: np.ndarray


class TokenDelivery:
    """Records token-carrying steps during a replay; ``deliver()`` times them afterwards."""

    def __init__(
        self,
        num_requests: int,
        ipc: float,
        detokenize_per_token: float,
        stream_per_token: float = 0.0,
    ) -> None:
        self.num_requests = num_requests
        self.ipc = ipc
        self.detokenize_per_token = detokenize_per_token
        self.stream_per_token = stream_per_token
        self.num_steps = 0
        self._ends = array("d")  # per step: when it ended
        self._lengths = array("q")  # per block (a step, or a run of steps): its steps
        self._batch = array("q")  # per block: requests that get a token each step
        self._members = array("q")  # request indices, block after block

    def step(self, end: float, members: list[int]) -> int:
        """One step that gave one token to each of ``members``; returns its step number."""
        g = self.num_steps
        self._ends.append(end)
        self._lengths.append(1)
        self._batch.append(len(members))
        self._members.extend(members)
        self.num_steps = g + 1
        return g

    def run(self, ends: np.ndarray, members: list[int]) -> None:
        """``len(ends)`` consecutive steps, each giving one token to each of ``members``."""
        self._ends.frombytes(ends.astype(np.float64, copy=False).tobytes())
        self._lengths.append(len(ends))
        self._batch.append(len(members))
        self._members.extend(members)
        self.num_steps += len(ends)

    def step_ends(self) -> np.ndarray:
        """Per recorded step: when it ended, the server's time of its tokens (a view that
        outlives ``deliver()``)."""
        return np.frombuffer(self._ends, dtype=np.float64)

    def deliver(self) -> Delivered:
        """Time all recorded steps (see the module docstring); the records are let go."""
        lengths = np.frombuffer(self._lengths, dtype=np.int64)
        batch = np.frombuffer(self._batch, dtype=np.int64)
        arrive = np.frombuffer(self._ends, dtype=np.float64) + self.ipc
        per_step = np.repeat(batch, lengths)
        served = serve_fifo(arrive, per_step * self.detokenize_per_token)
        detok = np.subtract(served.depart, arrive, out=arrive)
        client = np.add(served.depart, self.ipc, out=served.depart)
        if self.stream_per_token > 0:
            client = serve_fifo(client, per_step * self.stream_per_token).depart
        del per_step
        first = np.cumsum(lengths) - lengths  # first step of each block
        block_detok = np.add.reduceat(detok, first) if len(detok) else np.zeros(0)
        del detok, arrive
        # one chunk group per (block, member): request g_req has steps [g_first, g_last]
        g_req = np.frombuffer(self._members, dtype=np.int64)
        g_first = np.repeat(first, batch)
        g_last = np.repeat(first + lengths - 1, batch)
        n = self.num_requests
        output_tokens = np.bincount(g_req, weights=np.repeat(lengths, batch), minlength=n).astype(
            np.int64
        )
        detokenize_s = np.bincount(g_req, weights=np.repeat(block_detok, batch), minlength=n)
        between = self._gaps_between(client, g_req, g_first, g_last)
        del g_first, g_last, g_req
        self._ends, self._members = array("d"), array("q")
        within = self._gaps_within(client, first, lengths, batch)
        once = np.ones(len(between), np.int32)
        itl = WeightedSamples.join([WeightedSamples(between, once), within])
        del between, within, once
        itl = itl.sorted()
        return Delivered(
            client, output_tokens, detokenize_s, itl, served.queue_times, served.queue_lengths
        )

    @staticmethod
    def _gaps_between(
        client: np.ndarray, g_req: np.ndarray, g_first: np.ndarray, g_last: np.ndarray
    ) -> np.ndarray:
        """Gaps between each request's consecutive chunk groups (recorded in time order)."""
        order = np.argsort(g_req, kind="stable")
        req = g_req[order]
        same = req[1:] == req[:-1]
        del req
        after = g_first[order[1:][same]]
        before = g_last[order[:-1][same]]
        gaps: np.ndarray = client[after] - client[before]
        return gaps

    @staticmethod
    def _gaps_within(
        client: np.ndarray, first: np.ndarray, lengths: np.ndarray, batch: np.ndarray
    ) -> WeightedSamples:
        """The step gaps inside each run, once per request of the run."""
        weight = np.repeat(np.where(lengths >= 2, batch, 0).astype(np.int32), lengths)
        weight[first + lengths - 1] = 0  # from a block's last step on is not inside it
        inside = np.flatnonzero(weight[:-1])
        return WeightedSamples(client[inside + 1] - client[inside], weight[inside])
