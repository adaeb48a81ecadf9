"""Entry point of every child process: ``python -m engine.launch.child ROLE RANK CONFIG``.

A child dies with its parent (see ``die_with_parent``). SIGINT is ignored (the
launcher decides when to stop); SIGTERM exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from engine.ipc.config import ServeConfig
from engine.ipc.host_profile import profiled
from engine.launch.rundir import remove_run_dir

ROLES = ("tokenizer", "detokenizer", "scheduler")
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int, run_dir: Path) -> None:
    """Exit soon after ``parent_pid`` stops being this process's parent.

    Linux sends SIGUSR1 when the parent dies (``PR_SET_PDEATHSIG``); its
    handler removes the run directory the parent could not and exits. A
    watcher thread covers the race where the parent died before that was set,
    and a main thread stuck in a long native call.
    """

    def on_parent_death(signum: int, frame: object) -> None:
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        remove_run_dir(run_dir)
        raise SystemExit(1)

    signal.signal(signal.SIGUSR1, on_parent_death)
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGUSR1, 0, 0, 0)

    def watch() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1})
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        time.sleep(0.5)  # let the main thread's handler exit cleanly first
        remove_run_dir(run_dir)
        os._exit(1)

    if os.getppid() != parent_pid:
        remove_run_dir(run_dir)
        os._exit(1)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def setup_logging(level: str, name: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_once)
    die_with_parent(cfg.parent_pid, Path(cfg.run_dir))
    name = cfg.child_name(role, rank)
    setup_logging(cfg.log_level, name)
    with profiled(cfg.host_profile, name):
        run_role(cfg, role, rank)
    return 0


def run_role(cfg: ServeConfig, role: str, rank: int) -> None:
    if role == "tokenizer":
        from engine.tokenizer.worker import run_tokenizer

        run_tokenizer(cfg, rank)
    elif role == "detokenizer":
        from engine.detokenizer.process import run_detokenizer

        run_detokenizer(cfg)
    else:
        from engine.scheduler_proc.loop import run_scheduler

        run_scheduler(cfg, rank)


if __name__ == "__main__":
    sys.exit(main())
