"""The scheduler's settings as command-line flags, built from ``SchedulerConfig``'s fields.

``engine serve`` and ``sim replay`` both call ``add_scheduler_flags``: each field
becomes ``--field-name`` (a boolean also gets ``--no-field-name``), with the
field's help text and default (``core.settings``, which builds the engine's and
the router's flags the same way). The flags default to None, so that a value left
out keeps what a config file or the field's default says (``scheduler_config``).
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from core.scheduler.config import HOST_KV_POLICIES, SchedulerConfig
from core.scheduler.policy import POLICIES
from core.settings import add_flags, given

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
    add_flags(group, SchedulerConfig, _CHOICES)


def scheduler_config(
    args: argparse.Namespace, base: SchedulerConfig | None = None
) -> SchedulerConfig:
    """``base`` (the defaults when None) with the flags given; ``ValueError`` on a bad value."""
    return replace(base or SchedulerConfig(), **given(args, SchedulerConfig))
