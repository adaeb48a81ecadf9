"""Keep the host allocator from handing large blocks back to the OS at every step (CPU).

A CPU decode step gathers each layer's K/V into padded tensors of tens of MiB and frees
them a moment later. By default glibc serves blocks that large with ``mmap`` (and gives
them back with ``munmap``), or trims them off the heap's top when freed, so every layer of
every step pays fresh page faults: on a 2-core Xeon a SmolLM2 decode step of 20 x 2,049
contexts took 0.93-1.00 s that way and 0.55 s with the blocks kept (the same step of
20 x 1,025 contexts: 0.32 s either way). ``keep_large_blocks`` sets the ``mmap`` threshold
to glibc's largest, ``MMAP_THRESHOLD`` (blocks below it come from the heap), and the trim
threshold to ``TRIM_THRESHOLD`` (the heap keeps that much free memory on top), once per
process; elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
"""glibc's largest ``mmap`` threshold on 64-bit (``HEAP_MAX_SIZE / 2``)."""
TRIM_THRESHOLD = 512 << 20


def keep_large_blocks() -> bool:
    """Set glibc's ``mmap`` and trim thresholds (module docstring); whether it took."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    libc = ctypes.CDLL(name)
    if not hasattr(libc, "mallopt"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
