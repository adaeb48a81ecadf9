"""Give large freed buffers back to the operating system (glibc), so peak memory is what is live.

glibc serves blocks of at least its mmap threshold with ``mmap`` and unmaps
them when freed, but it raises that threshold (up to 32 MiB) each time such a
block is freed. After the first few numpy arrays of a replay are freed, the
next ones come from the heap and stay mapped once freed; a replay of an hour
then holds ~60 MB it no longer uses. A fixed threshold keeps the default
behaviour for small blocks and stops the drift.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3
"""``mallopt`` parameter number (glibc's malloc.h)."""
MMAP_THRESHOLD_BYTES = 1 << 17
"""glibc's initial threshold (128 KiB), kept fixed."""


def keep_mmap_threshold() -> bool:
    """Fix glibc's mmap threshold for this process; False where there is no glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    except (OSError, AttributeError):
        return False
