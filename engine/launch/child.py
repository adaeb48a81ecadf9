"""Entry point of every child process: ``python -m engine.launch.child ROLE RANK CONFIG``.

A child dies with its parent: Linux delivers SIGKILL when the parent exits
(``PR_SET_PDEATHSIG``), and a watcher thread catches the race where the parent
died before that was set. SIGINT is ignored (the launcher decides when to
stop); SIGTERM exits.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import threading
import time

import zmq

from engine import messages
from engine.launch.config import ServeConfig

ROLES = ("tokenizer", "detokenizer", "scheduler")
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Exit as soon as ``parent_pid`` is no longer this process's parent."""
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent_pid:
                os._exit(1)
            time.sleep(0.5)

    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


def report_ready(
    cfg: ServeConfig, ctx: zmq.Context[zmq.Socket[bytes]], role: str, rank: int, **info: object
) -> None:
    """Tell the launcher this child is ready to serve."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, 2000)
    sock.connect(cfg.ready_addr)
    sock.send(messages.encode(messages.Ready(role=role, rank=rank, pid=os.getpid(), info=info)))
    sock.close()


def _exit_once(signum: int, frame: object) -> None:
    """Exit on the first SIGTERM; later ones (during cleanup) are ignored."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] not in ROLES:
        print(
            f"usage: python -m engine.launch.child {{{','.join(ROLES)}}} RANK CONFIG",
            file=sys.stderr,
        )
        return 2
    role, rank, config_path = argv[0], int(argv[1]), argv[2]
    cfg = ServeConfig.load(config_path)
    die_with_parent(cfg.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_once)
    setup_logging(cfg.log_level, f"{role}{rank}")
    if role == "tokenizer":
        from engine.tokenizer.worker import run_tokenizer

        run_tokenizer(cfg, rank)
    elif role == "detokenizer":
        from engine.detokenizer.process import run_detokenizer

        run_detokenizer(cfg)
    else:
        from engine.scheduler_proc.loop import run_scheduler

        run_scheduler(cfg, rank)
    return 0


if __name__ == "__main__":
    sys.exit(main())
