"""``engine serve --host-profile DIR``: where each process's host time goes while it serves.

Every process of the server (the frontend, each tokenizer worker, each scheduler
rank, the detokenizer) samples its main thread's Python stack with pyinstrument
(a statistical profiler of wall-clock time: waiting on a socket or the device
shows as the call that waits), from the moment it is ready to serve (start-up
is left out) until it exits, and then writes into ``DIR``:

- ``NAME.txt``: the call tree, heaviest branches first (library frames folded);
- ``NAME.speedscope.json``: the whole tree, for https://www.speedscope.app or any
  speedscope viewer.

``NAME`` is the process's name in the logs (``frontend``, ``tokenizer0``,
``scheduler0``, ``detokenizer0``; with replicas, ``scheduler0.r1`` ...).
A process killed without cleanup (SIGKILL, or the watcher's exit after its
parent died) writes nothing. Sampling costs the sampled thread a little at every
function call and return; compare runs with and without it before trusting a
small difference.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyinstrument import Profiler

log = logging.getLogger(__name__)

INTERVAL_S = 0.0005
"""Seconds between samples: finer than a GPU decode step of a small model (~1 ms)."""
FILTER_THRESHOLD = 0.001
"""The text tree's smallest frame, as a share of the sampled time."""

_profiler: Profiler | None = None
"""This process's profiler, while ``profiled`` runs with a folder."""


def check_dir(path: str) -> Path:
    """``path`` resolved, created if missing; ``ValueError`` when it cannot hold the files."""
    folder = Path(path).resolve()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"--host-profile {path}: not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--host-profile {path}: cannot create it ({exc.strerror})") from None
    return folder


@contextlib.contextmanager
def profiled(folder: str | None, name: str) -> Iterator[None]:
    """Around a process's life: once ``serving`` is called (on this thread) sample its stacks,
    and write ``folder/name.*`` after the block, however it ends (an exception, ``SystemExit``
    included, passes through). Nothing when ``folder`` is None or the process never served."""
    global _profiler
    if folder is None:
        yield
        return
    from pyinstrument import Profiler

    _profiler = Profiler(interval=INTERVAL_S, async_mode="disabled")
    try:
        yield
    finally:
        profiler, _profiler = _profiler, None
        if profiler.is_running:
            write(profiler.stop(), Path(folder), name)


def serving() -> None:
    """The process is ready to serve: start sampling (when ``profiled`` has a folder)."""
    if _profiler is not None and not _profiler.is_running:
        _profiler.start()


def write(session: object, folder: Path, name: str) -> None:
    """The files of ``session`` (a pyinstrument ``Session``) under ``folder``."""
    from pyinstrument.renderers import ConsoleRenderer, SpeedscopeRenderer
    from pyinstrument.session import Session

    assert isinstance(session, Session)
    try:
        # frames down to 0.1 % of the run: an event loop that waits most of the time (the
        # frontend) would otherwise show none of its handlers (the default prunes below 1 %)
        options = {"filter_threshold": FILTER_THRESHOLD}
        text = ConsoleRenderer(unicode=True, color=False, processor_options=options).render(session)
        (folder / f"{name}.txt").write_text(text)
        (folder / f"{name}.speedscope.json").write_text(SpeedscopeRenderer().render(session))
    except OSError as exc:  # a full or vanished folder must not turn an exit into a crash
        log.error("--host-profile: cannot write %s's profile to %s: %s", name, folder, exc)
        return
    log.info("host profile of %s (%.1f s sampled) in %s", name, session.duration, folder)
