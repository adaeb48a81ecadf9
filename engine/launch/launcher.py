"""Start the children of one server, wait until they are ready, watch them, stop them all.

Invariant: every child is started by ``Launcher.start`` and ended by
``Launcher.stop`` (SIGTERM, then SIGKILL after a grace period), whatever made
the server stop: a signal, a dead child, or an error while starting.

The children follow ``--layout``: ``split`` spawns the tokenizer workers and,
per replica, the scheduler ranks and a detokenizer; ``frontend`` and ``inline``
spawn only each replica's scheduler ranks (the frontend's threads, or scheduler
rank 0's loop, tokenize and detokenize there).

With several replicas a child of one replica (a scheduler rank, its
detokenizer) that dies while the server runs takes only that replica down:
the launcher stops the replica's other children and reports it, and the
server stops when a shared child (a tokenizer worker) dies or no replica is left.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq

from engine.ipc import messages
from engine.ipc.config import ServeConfig

log = logging.getLogger(__name__)


class ChildDied(RuntimeError):
    """A child exited while the server was starting, or the server cannot go on without it."""


@dataclass
class Child:
    role: str
    rank: int
    replica: int | None  # None: shared by every replica (a tokenizer worker)
    name: str
    proc: subprocess.Popen[bytes]


def describe(dead: list[tuple[Child, int]]) -> str:
    """The dead children, killed ones first (when a killed child takes another down with it,
    both are found by the same check)."""
    dead = sorted(dead, key=lambda d: d[1] >= 0)
    return "; ".join(f"{c.name} (pid {c.proc.pid}) exited with code {code}" for c, code in dead)


@dataclass
class Launcher:
    """``replicas`` holds each replica's config (the first is the server's own).

    ``dead`` says why the server must stop; ``down`` why each replica that left
    the rotation did.
    """

    replicas: list[ServeConfig]
    children: list[Child] = field(default_factory=list)
    dead: str | None = None
    down: dict[int, str] = field(default_factory=dict)
    _stop_watch: threading.Event = field(default_factory=threading.Event)

    @property
    def cfg(self) -> ServeConfig:
        return self.replicas[0]

    @property
    def split(self) -> bool:
        """Whether tokenizer workers and detokenizers run as processes of their own (the
        ``split`` layout); otherwise the frontend or scheduler rank 0 hosts them."""
        return self.cfg.layout == "split"

    def start(self) -> None:
        """Spawn the tokenizer workers, and each replica's scheduler ranks and detokenizer
        (only the scheduler ranks unless the layout is ``split``)."""
        shared = str(self.cfg.save())
        plan: list[tuple[str, int, int | None, str]] = [
            ("tokenizer", i, None, shared) for i in range(self.cfg.num_tokenizers) if self.split
        ]
        for cfg in self.replicas:
            path = str(cfg.save())
            plan += [("scheduler", rank, cfg.replica, path) for rank in range(cfg.tp_size)]
            plan += [("detokenizer", 0, cfg.replica, path)] if self.split else []
        for role, rank, replica, config_path in plan:
            cmd = [sys.executable, "-m", "engine.launch.child", role, str(rank), config_path]
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
            name = self.cfg.child_name(role, rank, replica)
            self.children.append(Child(role, rank, replica, name, proc))
            log.info("started %s pid %d", name, proc.pid)

    def expected_ready(self) -> set[str]:
        """Children that report readiness (TP followers are covered by rank 0's report)."""
        if not self.split:
            return {self.cfg.child_name("scheduler", 0, r) for r in range(len(self.replicas))}
        names = {f"tokenizer{i}" for i in range(self.cfg.num_tokenizers)}
        for r in range(len(self.replicas)):
            names |= {self.cfg.child_name(role, 0, r) for role in ("scheduler", "detokenizer")}
        return names

    def wait_ready(
        self, ctx: zmq.Context[zmq.Socket[bytes]], timeout: float
    ) -> dict[str, messages.Ready]:
        """Block until every child has reported ready; raise if one dies or time runs out."""
        sock = ctx.socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(self.cfg.ready_addr)
        waiting = self.expected_ready()
        ready: dict[str, messages.Ready] = {}
        deadline = time.monotonic() + timeout
        try:
            while waiting:
                self.check_alive()
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"children not ready after {timeout:.0f}s: {sorted(waiting)}"
                    )
                if sock.poll(100):
                    msg = messages.decode(sock.recv())
                    if isinstance(msg, messages.Ready):
                        name = self.cfg.child_name(msg.role, msg.rank, msg.replica)
                        ready[name] = msg
                        waiting.discard(name)
                        log.info("%s ready (pid %d)", name, msg.pid)
        finally:
            sock.close()
        return ready

    def check_alive(self) -> None:
        """Raise ``ChildDied`` naming every child that has exited."""
        dead = [(c, code) for c in self.children if (code := c.proc.poll()) is not None]
        if dead:
            self.dead = describe(dead)
            raise ChildDied(self.dead)

    def check_running(self) -> list[tuple[int, str]]:
        """While serving: the replicas newly down, with why (their other children are being
        stopped); raise ``ChildDied`` when a shared child died or no replica is left."""
        dead = [
            (c, code)
            for c in self.children
            if c.replica not in self.down and (code := c.proc.poll()) is not None
        ]
        if any(c.replica is None for c, _ in dead):
            self.dead = describe(dead)
            raise ChildDied(self.dead)
        newly: list[tuple[int, str]] = []
        for r in sorted({c.replica for c, _ in dead if c.replica is not None}):
            newly.append((r, describe([(c, code) for c, code in dead if c.replica == r])))
            self.down[r] = newly[-1][1]
        if len(self.down) == len(self.replicas):
            self.dead = "; ".join(self.down[r] for r in sorted(self.down))
            raise ChildDied(self.dead)
        for r, _ in newly:
            rest = [c for c in self.children if c.replica == r]
            threading.Thread(target=self.stop_children, args=(rest,), daemon=True).start()
        return newly

    def watch(
        self, on_death: Callable[[str], None], on_replica_down: Callable[[int, str], None]
    ) -> threading.Thread:
        """From a thread: ``on_replica_down(replica, description)`` when a replica loses a
        child while others live, ``on_death(description)`` once the server cannot go on."""

        def loop() -> None:
            while not self._stop_watch.wait(0.2):
                try:
                    for replica, reason in self.check_running():
                        log.error("replica %d is down: %s", replica, reason)
                        on_replica_down(replica, reason)
                except ChildDied as exc:
                    log.error("%s; shutting down", exc)
                    on_death(str(exc))
                    return

        thread = threading.Thread(target=loop, name="child-watch", daemon=True)
        thread.start()
        return thread

    def stop(self, grace: float = 5.0) -> None:
        """Terminate every child, escalating to SIGKILL after ``grace`` seconds."""
        self._stop_watch.set()
        self.stop_children(self.children, grace)

    @staticmethod
    def stop_children(children: list[Child], grace: float = 5.0) -> None:
        for child in children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in children:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(remaining)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing", child.name, child.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
