"""The host allocator's thresholds, set once per process through glibc's ``mallopt``.

Two settings, for two kinds of process:

- ``keep_large_blocks`` (the engine's CPU runner): keep large blocks freed at every step.
  A CPU decode step gathers each layer's K/V into padded tensors of tens of MiB and frees
  them a moment later. By default glibc serves blocks that large with ``mmap`` (and gives
  them back with ``munmap``), or trims them off the heap's top when freed, so every layer
  of every step pays fresh page faults: on a 2-core Xeon a SmolLM2 decode step of
  20 x 2,049 contexts took 0.93-1.00 s that way and 0.55 s with the blocks kept (the same
  step of 20 x 1,025 contexts: 0.32 s either way). It sets the ``mmap`` threshold to
  glibc's largest, ``MMAP_THRESHOLD`` (blocks below it come from the heap), and the trim
  threshold to ``TRIM_THRESHOLD`` (the heap keeps that much free memory on top).
- ``keep_mmap_threshold`` (the simulator's commands): give large freed buffers back to the
  operating system, so peak memory is what is live. glibc raises its mmap threshold (up to
  32 MiB) each time an mmapped block is freed; after the first few numpy arrays of a
  replay are freed, the next ones come from the heap and stay mapped once freed, and a
  replay of an hour then holds ~60 MB it no longer uses. Fixing the threshold at glibc's
  initial ``INITIAL_MMAP_THRESHOLD`` keeps the default for small blocks and stops the drift.

Elsewhere than glibc (no ``mallopt``) both do nothing and return False.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter numbers (glibc's malloc.h)."""
MMAP_THRESHOLD = 32 << 20
"""glibc's largest ``mmap`` threshold on 64-bit (``HEAP_MAX_SIZE / 2``)."""
TRIM_THRESHOLD = 512 << 20
INITIAL_MMAP_THRESHOLD = 1 << 17
"""glibc's initial ``mmap`` threshold (128 KiB)."""


def mallopt(*settings: tuple[int, int]) -> bool:
    """Set each ``(parameter, value)`` with glibc's ``mallopt``; whether all took (False where
    there is no glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        call = libc.mallopt
    except (OSError, AttributeError):
        return False
    call.argtypes = (ctypes.c_int, ctypes.c_int)
    call.restype = ctypes.c_int
    return all([bool(call(param, value)) for param, value in settings])


def keep_large_blocks() -> bool:
    """The engine's CPU runner: keep large blocks on the heap (module docstring)."""
    return mallopt((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def keep_mmap_threshold() -> bool:
    """The simulator's commands: fix the mmap threshold at glibc's initial one (module
    docstring)."""
    return mallopt((M_MMAP_THRESHOLD, INITIAL_MMAP_THRESHOLD))
