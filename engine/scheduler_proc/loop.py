"""The process loop of a scheduler rank.

Rank 0 owns the core and the model's leader: it drains its inbox without
blocking while there is work, blocks on the socket (with a timeout) when idle,
runs steps, sends each step's tokens on (``cfg.token_addr``: the detokenizer,
or with ``--layout frontend`` the frontend) and the core's counters to the
frontend. Ranks >= 1 run ``follower_main`` and execute what rank 0 broadcasts.
With ``--layout inline`` rank 0 takes requests as text from the frontend and
sends text back (``engine.scheduler_proc.inline``): tokenizing a request sits
between two steps, in the same pass that drains the inbox.

With overlap scheduling (the default on CUDA) an iteration launches step N+1
before it finishes step N::

    launch N+1 (schedule, inputs, start on the GPU) -> finish N (wait, complete, send)

so the GPU runs N+1 while the host completes N and forms N+2. Without it,
every step is finished before the next is scheduled; the calls are the same.

With ``--role prefill|decode`` rank 0 also drives its role's hand-offs
(``engine.scheduler_proc.pd``): after every step, on the sockets it polls between
steps, and while idle it wakes on their messages too.

With ``record_steps`` rank 0 writes the step record there, or with several
replicas to its replica's file beside it (``schema.steprecord.replica_record_path``;
``engine.scheduler_proc.recorder``): flushed whenever the loop falls idle, and
at exit (SIGTERM included).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from engine.ipc import messages
from engine.ipc.config import ServeConfig
from engine.ipc.sockets import open_sockets, report_ready
from engine.runner.args import RunnerArgs
from engine.runner.hardware import hardware
from engine.scheduler_proc.driver import Launched, StepDriver
from engine.scheduler_proc.inline import InlineText
from engine.scheduler_proc.pd import Handoffs
from engine.scheduler_proc.pd_decode import DecodeHandoffs
from engine.scheduler_proc.pd_prefill import PrefillHandoffs
from engine.scheduler_proc.recorder import StepRecorder
from schema.steprecord import replica_record_path

if TYPE_CHECKING:
    from engine.runner.tp import TPLeader

log = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # how long an idle loop blocks on its inbox
STALLED_POLL_MS = 2  # work exists but nothing could run (e.g. waiting for pages)
STATS_INTERVAL_S = 0.05


def runner_args(cfg: ServeConfig) -> RunnerArgs:
    """The runner's arguments, as the serve config holds them (the core's settings inside)."""
    return cfg.runner


def run_scheduler(cfg: ServeConfig, rank: int) -> None:
    from engine.runner.tp import TPLeader, follower_main

    args = runner_args(cfg)
    if rank > 0:
        follower_main(args, rank)
        return
    leader = TPLeader(args)
    try:
        serve_rank0(cfg, leader)
    finally:
        leader.shutdown()


def serve_rank0(cfg: ServeConfig, leader: TPLeader) -> None:
    runner = leader.runner
    sched_cfg = runner.sized_scheduler()
    recorder = None
    if cfg.record_steps is not None:
        path = replica_record_path(Path(cfg.record_steps), cfg.replica, cfg.dp_size)
        recorder = StepRecorder(
            path, speculative=cfg.speculative.on, transfers=sched_cfg.role != "colocated"
        )
        runner.time_steps = True
        log.info("recording every step in %s", path)
    drafter = cfg.speculative.drafter(runner.model, sched_cfg.max_running)
    acceptance = cfg.speculative.acceptance()
    engine = StepDriver(sched_cfg, leader.launch, cfg.eos_token_ids, recorder, drafter, acceptance)
    text = InlineText(cfg) if cfg.layout == "inline" else None
    ctx, inbox, (outputs, to_frontend) = open_sockets(
        cfg.scheduler_addr, cfg.token_addr, cfg.frontend_addr
    )
    pd: Handoffs | None = None
    pd_info: dict[str, str] = {}
    if sched_cfg.role == "prefill":
        pd = PrefillHandoffs(engine, runner.kv, cfg.pd_timeout)
    elif sched_cfg.role == "decode":
        decode = pd = DecodeHandoffs(
            engine, runner.kv, cfg.pd_host, cfg.pd_timeout, cfg.pd_cuda_ipc
        )
        pd_info = {"handoff_addr": decode.address, "kv_addr": decode.receiver.address}
        log.info("decode role: hand-offs at %s, KV at %s", *pd_info.values())
    if recorder is not None and pd is not None:
        recorder.transfer_counters = pd.counters
    report_ready(
        cfg,
        ctx,
        "scheduler",
        0,
        num_pages=runner.num_pages,
        host_pages=runner.host_pages,
        page_size=runner.page_size,
        eos_token_ids=cfg.eos_token_ids,
        scheduler=sched_cfg,
        hardware=hardware(cfg.device, cfg.tp_size),
        **pd_info,
    )
    log.info(
        "ready: %d KV pages of %d tokens, %d host KV pages",
        runner.num_pages,
        runner.page_size,
        runner.host_pages,
    )
    log.info("overlap scheduling %s; layout %s", "on" if cfg.overlap_on else "off", cfg.layout)
    k = sched_cfg.num_draft_tokens
    if drafter is not None:
        log.info("speculative decoding: %s, up to %d draft tokens", cfg.speculative.method, k)
    elif k:
        log.warning("--num-draft-tokens %d without --speculative: no drafter, no drafts", k)
    loop = SchedulerLoop(engine, inbox, outputs, to_frontend, cfg.overlap_on, cfg.replica, text)
    loop.pd = pd
    if runner.host_kv is not None:
        loop.host_load_s = runner.host_kv.load_seconds
    try:
        loop.run()
    finally:
        if recorder is not None:
            recorder.close()
        if pd is not None:
            pd.close()


class SchedulerLoop:
    """``outputs``: where a step's outputs go, as tokens (``split``, ``frontend``) or, when
    ``text`` is given (``inline``), as text."""

    def __init__(
        self,
        engine: StepDriver,
        inbox: zmq.Socket[bytes],
        outputs: zmq.Socket[bytes],
        to_frontend: zmq.Socket[bytes],
        overlap: bool,
        replica: int,
        text: InlineText | None = None,
    ) -> None:
        self.engine = engine
        self.overlap = overlap
        self.replica = replica
        self.inbox = inbox
        self.outputs = outputs
        self.to_frontend = to_frontend
        self.text = text
        self.last_stats: messages.StatsUpdate | None = None
        self.last_stats_time = 0.0
        self.host_load_s: Callable[[], float] | None = None  # the host KV pool's load time
        self.pd: Handoffs | None = None  # a prefill or decode role's hand-offs

    def run(self) -> None:
        stalled = False
        in_flight: Launched | None = None
        while True:
            busy = self.engine.has_work() or in_flight is not None
            timeout = (STALLED_POLL_MS if stalled else 0) if busy else IDLE_POLL_MS
            if self.pd is not None:
                timeout = self.pd.wait_ms(timeout)
            items = self.receive(timeout)
            produced, in_flight, stalled = self.engine.advance(in_flight, self.overlap)
            items += produced
            if self.pd is not None:
                items += self.pd.after_step(items)
            if items:
                self.send_outputs(items)
            idle = not self.engine.has_work()  # nothing waits, runs or is in flight
            if idle and self.engine.recorder is not None:
                self.engine.recorder.flush()
            self.send_stats(force=idle)

    def receive(self, timeout_ms: int) -> list[messages.TokenItem]:
        """Handle every message waiting (after blocking up to ``timeout_ms`` for the first)."""
        errors: list[messages.TokenItem] = []
        if timeout_ms and not self.wait(timeout_ms):
            return errors
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return errors
            msg = messages.try_decode(data)
            if isinstance(msg, messages.GenerateRequest) and self.text is not None:
                tokenized = self.text.tokenize(msg)
                if isinstance(tokenized, messages.TokenItem):
                    errors.append(tokenized)
                    continue
                msg = tokenized
            if isinstance(msg, messages.TokenizedRequest):
                error = self.engine.add(msg) if self.pd is None else self.pd.add(msg)
                if error is not None:
                    errors.append(error)
            elif isinstance(msg, messages.AbortRequest):
                self.engine.abort(msg.rid, msg.reason)
                if self.pd is not None:
                    self.pd.abort(msg.rid)
            elif msg is not None:
                log.error("unexpected message %s", type(msg).__name__)

    def wait(self, timeout_ms: int) -> bool:
        """Block up to ``timeout_ms`` for a message in the inbox (or on the hand-offs'
        sockets); whether one came."""
        if self.pd is None:
            return bool(self.inbox.poll(timeout_ms))
        poller = zmq.Poller()
        for sock in (self.inbox, *self.pd.sockets()):
            poller.register(sock, zmq.POLLIN)
        return bool(poller.poll(timeout_ms))

    def send_outputs(self, items: list[messages.TokenItem]) -> None:
        """Send a step's tokens on; ``inline``: their text, a stop string's match aborted here."""
        if self.text is None:
            self.outputs.send(messages.encode(messages.TokenBatch(items=items)))
            return
        texts, stopped = self.text.detokenize(items)
        for rid in stopped:
            log.info("rid %s matched a stop string; aborting it", rid)
            self.engine.abort(rid, "stop string")
        if texts:
            self.outputs.send(messages.encode(messages.TextBatch(items=texts)))

    def send_stats(self, force: bool) -> None:
        """Send the core's counters when they changed, at most every ``STATS_INTERVAL_S``."""
        now = time.time()
        if not force and now - self.last_stats_time < STATS_INTERVAL_S:
            return
        spec = self.engine.speculative
        update = messages.StatsUpdate(
            time=now,
            stats=self.engine.stats(),
            num_preemptions=self.engine.num_preemptions,
            replica=self.replica,
            host_load_s=self.host_load_s() if self.host_load_s is not None else 0.0,
            speculative=spec.snapshot() if spec is not None else None,
            transfers=self.pd.stats() if self.pd is not None else None,
        )
        last = self.last_stats
        if last is not None and _counts(last) == _counts(update):
            return
        self.last_stats = update
        self.last_stats_time = now
        self.to_frontend.send(messages.encode(update))


def _counts(update: messages.StatsUpdate) -> tuple[object, ...]:
    """What a ``StatsUpdate`` says, but its time."""
    return (
        update.stats,
        update.num_preemptions,
        update.host_load_s,
        update.speculative,
        update.transfers,
    )
