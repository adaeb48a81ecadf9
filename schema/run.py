"""What one run gives, real or simulated: its tables and summary."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from schema.samples import Samples


@dataclass(slots=True)
class RunResult:
    """``summary.json``'s content, the request, step and queue tables, and the ITL samples."""

    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    queues: pd.DataFrame
    itl_s: Samples
