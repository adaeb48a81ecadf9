"""The scheduler's settings as command-line flags, built from ``SchedulerConfig``'s fields.

``engine serve`` and ``sim replay`` both call ``add_scheduler_flags``: each field
becomes ``--field-name`` (a boolean also gets ``--no-field-name``), with the
field's help text and default. The flags default to None, so that a value left
out keeps what a config file or the field's default says (``scheduler_config``).
"""

from __future__ import annotations

import argparse
from dataclasses import fields, replace
from typing import Any

from core.scheduler.config import HOST_KV_POLICIES, SchedulerConfig
from core.scheduler.policy import POLICIES

_TYPES: dict[str, type] = {"int": int, "int | None": int, "float": float, "str": str}
_CHOICES: dict[str, list[str]] = {
    "policy": sorted(POLICIES),
    "host_kv_policy": list(HOST_KV_POLICIES),
}


def flag(name: str) -> str:
    """The command-line flag of the field ``name``."""
    return "--" + name.replace("_", "-")


def add_scheduler_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per ``SchedulerConfig`` field, in a group of its own."""
    group = parser.add_argument_group("scheduler", "the shared scheduler core's settings")
    for f in fields(SchedulerConfig):
        help_ = f.metadata["help"] + ("" if f.default is None else f" (default: {f.default})")
        if f.type == "bool":
            group.add_argument(
                flag(f.name), action=argparse.BooleanOptionalAction, default=None, help=help_
            )
        elif f.name in _CHOICES:
            group.add_argument(flag(f.name), choices=_CHOICES[f.name], default=None, help=help_)
        else:
            group.add_argument(flag(f.name), type=_TYPES[str(f.type)], default=None, help=help_)


def given_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler fields given on the command line (the flags not left out)."""
    values = {f.name: getattr(args, f.name, None) for f in fields(SchedulerConfig)}
    return {name: value for name, value in values.items() if value is not None}


def scheduler_config(
    args: argparse.Namespace, base: SchedulerConfig | None = None
) -> SchedulerConfig:
    """``base`` (the defaults when None) with the flags given; ``ValueError`` on a bad value."""
    return replace(base or SchedulerConfig(), **given_settings(args))
