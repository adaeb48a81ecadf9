"""uvicorn's own log lines (startup, access, errors) in the engine's format.

``engine serve`` sets up the root logger (``time process level logger: message``).
uvicorn would install handlers and formatters of its own; with this config its
loggers keep none and pass every record up to the root logger's handler instead.
"""

from __future__ import annotations

from typing import Any

UVICORN_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access")


def uvicorn_log_config() -> dict[str, Any]:
    """``uvicorn.Config(log_config=...)``: uvicorn's loggers write through the root logger."""
    loggers = {name: {"handlers": [], "propagate": True} for name in UVICORN_LOGGERS}
    return {"version": 1, "disable_existing_loggers": False, "loggers": loggers}
