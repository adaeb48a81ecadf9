"""The start-up heap, frozen out of the garbage collector's scans.

A full collection walks every object the collector tracks. A process that
imported FastAPI, transformers or torch and loaded a tokenizer or a model holds
hundreds of thousands of them, so a full collection while serving stalls it
for tens to hundreds of milliseconds, and every request in flight waits. After
start-up ``freeze_heap`` collects once and moves everything still alive into
the permanent generation (``gc.freeze``), which later collections skip;
objects made while serving are collected as before. ``engine serve`` does it in
every process once it is ready (``--no-gc-freeze`` turns it off), and
``engine bench`` in its load generator after the warm-up.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_heap() -> int:
    """Collect, then freeze what is left; the number of objects now frozen."""
    gc.collect()
    gc.freeze()
    count = gc.get_freeze_count()
    log.info("gc: froze %d start-up objects; collections skip them", count)
    return count
