"""A private run directory for the ipc:// sockets of one server, removed at exit."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def make_run_dir() -> Path:
    """A fresh directory only the current user can enter (mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="engine-"))
    os.chmod(path, 0o700)
    return path


def remove_run_dir(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
