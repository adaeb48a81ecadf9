"""The router's settings as flat config keys and command-line flags, built from ``RouterConfig``.

The key ``router`` names the policy; every other field ``f`` is the key
``router_f`` (flag ``--router-f``), so a simulator config holds the router's
settings beside the scheduler's without a clash (both have a ``policy`` and
a ``seed``). ``engine serve --dp``, ``sim replay`` and ``engine router`` all
build these flags here, from the fields' defaults and help (``core.settings``);
``engine router`` also takes the fields' own names (``--policy``, ``--load``).
The flags default to None, so that a value left out keeps what a config file
or the field's default says.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict, fields
from typing import Any

from core.router.config import RouterConfig
from core.router.policy import POLICIES, make_policy
from core.settings import add_flag

ROUTER_KEYS = {"router": "policy"} | {
    f"router_{f.name}": f.name for f in fields(RouterConfig) if f.name != "policy"
}
"""Flat key -> ``RouterConfig`` field."""


def router_flag(key: str) -> str:
    """The flag of the flat key ``key``: ``--router``, ``--router-load``, ..."""
    return "--" + key.replace("_", "-")


def add_router_flags(
    parser: argparse.ArgumentParser, replicas_flag: str = "--replicas N", bare: bool = False
) -> None:
    """``--router POLICY`` and one ``--router-field`` flag per other field, in a group. With
    ``bare`` each also answers to the field's own name (``--policy``, ``--load``, ...)."""
    with_ = f" (with {replicas_flag})" if replicas_flag else ""
    group = parser.add_argument_group("router", f"the router core's settings{with_}")
    by_name = {f.name: f for f in fields(RouterConfig)}
    for key, name in ROUTER_KEYS.items():
        names = [router_flag(key)] + (["--" + name.replace("_", "-")] if bare else [])
        choices = sorted(POLICIES) if name == "policy" else None
        add_flag(group, by_name[name], names, dest=key, choices=choices)


def router_config(args: argparse.Namespace) -> RouterConfig:
    """The router core's settings from the router flags given; ``ValueError`` if bad."""
    given = {k: v for k, v in vars(args).items() if k in ROUTER_KEYS and v is not None}
    return pop_router_config(given)


def pop_router_config(values: dict[str, Any]) -> RouterConfig:
    """The ``RouterConfig`` of the router keys in ``values`` (removed from it); ``ValueError``
    on a bad value, an unknown policy included."""
    given = values.pop("router", None)
    if isinstance(given, RouterConfig):
        base = asdict(given)
    else:
        base = {} if given is None else {"policy": given}
    base.update({ROUTER_KEYS[k]: values.pop(k) for k in list(values) if k in ROUTER_KEYS})
    config = RouterConfig(**base)
    make_policy(config)  # the registry's own check: an unknown policy is a ValueError
    return config


def router_keys(config: RouterConfig) -> dict[str, Any]:
    """``config`` as flat keys (``pop_router_config`` reads them back)."""
    return {key: getattr(config, name) for key, name in ROUTER_KEYS.items()}
