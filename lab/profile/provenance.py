"""Where a profile's numbers come from: hardware, software, model and runner settings."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "tokenizers", "flashinfer-python", "pyzmq", "fastapi")


def versions() -> str:
    found = [f"python {platform.python_version()}"]
    for name in PACKAGES:
        try:
            found.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    if torch.version.cuda:
        found.append(f"cuda {torch.version.cuda}")
    return ", ".join(found)


def source_revision() -> str:
    """The git commit of this checkout (``+dirty`` with local changes), or ``unknown``."""
    try:
        rev = subprocess.run(
            ["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return rev.stdout.strip() or "unknown"


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
