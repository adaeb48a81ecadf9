"""uvicorn's own log lines (startup, access, errors) in the engine's format.

``engine serve`` sets up the root logger (``time process level logger: message``).
uvicorn would install handlers and formatters of its own; with this config its
loggers keep none and pass every record up to the root logger's handler instead.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def uvicorn_log_config() -> dict[str, Any]:
    """``uvicorn.Config(log_config=...)``: uvicorn's loggers write through the root logger."""
    loggers = {name: {"handlers": [], "propagate": True} for name in UVICORN_LOGGERS}
    return {"version": 1, "disable_existing_loggers": False, "loggers": loggers}


def configure_logging(level: str, process: str) -> None:
    """The root logger of a server process: ``time process level logger: message`` on stderr."""
    logging.basicConfig(
        level=level.upper(),
        format=f"%(asctime)s {process} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
