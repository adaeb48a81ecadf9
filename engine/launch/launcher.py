"""Start the children of one server, wait until they are ready, watch them, stop them all.

Invariant: every child is started by ``Launcher.start`` and ended by
``Launcher.stop`` (SIGTERM, then SIGKILL after a grace period), whatever made
the server stop: a signal, a dead child, or an error while starting.
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
    """A child exited while the server was starting or running."""


@dataclass
class Child:
    role: str
    rank: int
    proc: subprocess.Popen[bytes]

    @property
    def name(self) -> str:
        return f"{self.role}{self.rank}"


@dataclass
class Launcher:
    cfg: ServeConfig
    children: list[Child] = field(default_factory=list)
    dead: str | None = None
    _stop_watch: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        """Spawn the scheduler ranks, the tokenizer workers and the detokenizer."""
        config_path = str(self.cfg.save())
        plan = [("scheduler", r) for r in range(self.cfg.tp_size)]
        plan += [("tokenizer", i) for i in range(self.cfg.num_tokenizers)]
        plan += [("detokenizer", 0)]
        for role, rank in plan:
            cmd = [sys.executable, "-m", "engine.launch.child", role, str(rank), config_path]
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
            self.children.append(Child(role, rank, proc))
            log.info("started %s%d pid %d", role, rank, proc.pid)

    def expected_ready(self) -> set[str]:
        """Children that report readiness (TP followers are covered by rank 0's report)."""
        names = {"scheduler0", "detokenizer0"}
        names |= {f"tokenizer{i}" for i in range(self.cfg.num_tokenizers)}
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
                        name = f"{msg.role}{msg.rank}"
                        ready[name] = msg
                        waiting.discard(name)
                        log.info("%s ready (pid %d)", name, msg.pid)
        finally:
            sock.close()
        return ready

    def check_alive(self) -> None:
        """Raise ``ChildDied`` naming every child that has exited (killed ones first: when a
        killed child takes another down with it, both are found by the same check)."""
        dead = [(c, code) for c in self.children if (code := c.proc.poll()) is not None]
        if dead:
            dead.sort(key=lambda d: d[1] >= 0)
            self.dead = "; ".join(
                f"{c.name} (pid {c.proc.pid}) exited with code {code}" for c, code in dead
            )
            raise ChildDied(self.dead)

    def watch(self, on_death: Callable[[str], None]) -> threading.Thread:
        """Call ``on_death(description)`` from a thread once any child exits."""

        def loop() -> None:
            while not self._stop_watch.wait(0.2):
                try:
                    self.check_alive()
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
        for child in self.children:
            if child.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for child in self.children:
            remaining = max(0.0, deadline - time.monotonic())
            try:
                child.proc.wait(remaining)
            except subprocess.TimeoutExpired:
                log.warning("%s (pid %d) ignored SIGTERM; killing", child.name, child.proc.pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
