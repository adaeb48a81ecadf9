"""Where a profile's numbers come from: hardware, software, model and runner settings."""

from __future__ import annotations

import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("torch", "transformers", "tokenizers", "flashinfer-python", "pyzmq", "fastapi")


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def hardware(device: str, tp: int) -> str:
    """``2x NVIDIA H200`` on CUDA, ``CPU: <model>, N cores`` otherwise."""
    if device.startswith("cuda") and torch.cuda.is_available():
        return f"{tp}x {torch.cuda.get_device_name()}"
    return f"CPU: {cpu_name()}, {os.cpu_count()} cores"


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
