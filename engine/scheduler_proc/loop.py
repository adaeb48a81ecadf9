"""The process loop of a scheduler rank.

Rank 0 owns the core and the model's leader: it drains its inbox without
blocking while there is work, blocks on the socket (with a timeout) when idle,
runs one step, sends the step's tokens to the detokenizer and the core's
counters to the frontend. Ranks >= 1 run ``follower_main`` and execute what
rank 0 broadcasts.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import msgspec
import zmq

from engine import messages
from engine.launch.child import report_ready
from engine.launch.config import ServeConfig
from engine.runner.args import RunnerArgs
from engine.scheduler import SchedulerConfig
from engine.scheduler_proc.engine import Engine

if TYPE_CHECKING:
    from engine.runner.tp import TPLeader

log = logging.getLogger(__name__)

IDLE_POLL_MS = 500  # how long an idle loop blocks on its inbox
STALLED_POLL_MS = 2  # work exists but nothing could run (e.g. waiting for pages)
STATS_INTERVAL_S = 0.05


def runner_args(cfg: ServeConfig) -> RunnerArgs:
    return RunnerArgs(
        model=cfg.model_path,
        device=cfg.device,
        dtype=cfg.dtype,
        tp_size=cfg.tp_size,
        num_pages=cfg.num_pages,
        page_size=cfg.page_size,
        dummy_weights=cfg.dummy_weights,
        seed=cfg.seed,
        dist_init=cfg.dist_init,
        cpu_threads=cfg.cpu_threads or 0,
    )


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
    sched_cfg = SchedulerConfig(
        num_pages=runner.num_pages,
        page_size=runner.page_size,
        max_running=cfg.max_running,
        max_prefill_tokens=cfg.max_prefill_tokens,
        policy=cfg.policy,
        prefix_cache=cfg.prefix_cache,
    )
    engine = Engine(sched_cfg, leader.step, runner.eos_token_ids)
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.PULL)
    inbox.bind(cfg.scheduler_addr)
    to_detok = ctx.socket(zmq.PUSH)
    to_detok.connect(cfg.detokenizer_addr)
    to_frontend = ctx.socket(zmq.PUSH)
    to_frontend.connect(cfg.frontend_addr)
    report_ready(
        cfg,
        ctx,
        "scheduler",
        0,
        num_pages=runner.num_pages,
        page_size=runner.page_size,
        eos_token_ids=list(runner.eos_token_ids),
    )
    log.info("ready: %d KV pages of %d tokens", runner.num_pages, runner.page_size)
    loop = SchedulerLoop(engine, inbox, to_detok, to_frontend)
    loop.run()


class SchedulerLoop:
    def __init__(
        self,
        engine: Engine,
        inbox: zmq.Socket[bytes],
        to_detok: zmq.Socket[bytes],
        to_frontend: zmq.Socket[bytes],
    ) -> None:
        self.engine = engine
        self.inbox = inbox
        self.to_detok = to_detok
        self.to_frontend = to_frontend
        self.last_stats: tuple[int, ...] | None = None
        self.last_stats_time = 0.0

    def run(self) -> None:
        stalled = False
        while True:
            if self.engine.has_work():
                timeout = STALLED_POLL_MS if stalled else 0
            else:
                timeout = IDLE_POLL_MS
            errors = self.receive(timeout)
            items = list(errors)
            stalled = False
            if self.engine.has_work():
                items += self.engine.step()
                plan = self.engine.last_plan
                stalled = plan is not None and not plan.has_model_work and not items
            if items:
                self.to_detok.send(messages.encode(messages.TokenBatch(items=items)))
            self.send_stats(force=not self.engine.has_work())

    def receive(self, timeout_ms: int) -> list[messages.TokenItem]:
        """Handle every message waiting (after blocking up to ``timeout_ms`` for the first)."""
        errors: list[messages.TokenItem] = []
        if timeout_ms and not self.inbox.poll(timeout_ms):
            return errors
        while True:
            try:
                data = self.inbox.recv(zmq.NOBLOCK)
            except zmq.Again:
                return errors
            try:
                msg = messages.decode(data)
            except msgspec.DecodeError as exc:
                log.error("dropped an undecodable message: %s", exc)
                continue
            if isinstance(msg, messages.TokenizedRequest):
                error = self.engine.add(msg)
                if error is not None:
                    errors.append(error)
            elif isinstance(msg, messages.AbortRequest):
                self.engine.abort(msg.rid, msg.reason)
            else:
                log.error("unexpected message %s", type(msg).__name__)

    def send_stats(self, force: bool) -> None:
        """Send the core's counters when they changed, at most every ``STATS_INTERVAL_S``."""
        now = time.time()
        if not force and now - self.last_stats_time < STATS_INTERVAL_S:
            return
        s = self.engine.stats()
        key = (
            s.pages_used,
            s.pages_cached,
            s.num_waiting,
            s.num_running,
            s.prompt_tokens,
            s.cached_tokens,
        )
        if key == self.last_stats:
            return
        self.last_stats = key
        self.last_stats_time = now
        update = messages.StatsUpdate(
            time=now,
            num_pages=s.num_pages,
            pages_used=s.pages_used,
            pages_free=s.pages_free,
            pages_cached=s.pages_cached,
            num_waiting=s.num_waiting,
            num_running=s.num_running,
            prompt_tokens=s.prompt_tokens,
            cached_tokens=s.cached_tokens,
        )
        self.to_frontend.send(messages.encode(update))
