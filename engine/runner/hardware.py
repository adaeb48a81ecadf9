"""What a runner runs on, in the words profiles and model cards use for it."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


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
