"""Settings declared once: a dataclass field carries its default and its flag's help.

A field made with ``setting(default, help)`` is a command-line setting: its
flag is ``--field-name`` (or the ``flag`` it names), a boolean also gets
``--no-field-name``, and ``add_flags`` builds them all from the class. A field
made with ``derived(default, how)`` is set by the program (a resolved path, a
per-process value) and has no flag. The flags default to None, so that a value
left out keeps the field's default (or what a config file says): ``given``
returns only the values given.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, Field, field, fields
from typing import Any

_TYPES: dict[str, Callable[[str], Any]] = {
    "int": int,
    "int | None": int,
    "float": float,
    "float | None": float,
    "str": str,
    "str | None": str,
}


def setting(
    default: Any = MISSING,
    help: str = "",
    *,
    flag: str | None = None,
    parse: Callable[[str], Any] | None = None,
    choices: Sequence[str] | None = None,
    metavar: str | None = None,
) -> Any:
    """A field that is a setting: ``default`` (MISSING: required), the help of its flag,
    the flag's name when it is not ``--field-name``, how its text is parsed, its choices."""
    meta = {"help": help, "flag": flag, "parse": parse, "choices": choices, "metavar": metavar}
    return field(default=default, metadata=meta)


def derived(default: Any, how: str) -> Any:
    """A field the program sets (``how`` says from what); no flag reaches it. (A field without
    a default, or with a default factory, says so in its metadata: ``{"derived": how}``.)"""
    return field(default=default, metadata={"derived": how})


def is_setting(f: Field[Any]) -> bool:
    return "help" in f.metadata


def settings_of(cls: type) -> list[Field[Any]]:
    """The fields of the dataclass ``cls`` that are settings (those with a flag)."""
    return [f for f in fields(cls) if is_setting(f)]


def flag_of(f: Field[Any]) -> str:
    """The flag of the setting ``f``."""
    return str(f.metadata.get("flag") or "--" + f.name.replace("_", "-"))


def help_of(f: Field[Any]) -> str:
    """The field's help, with its default unless that is None or missing."""
    shown = f.default is not None and f.default is not MISSING
    return str(f.metadata["help"]) + (f" (default: {f.default})" if shown else "")


def add_flag(
    group: argparse._ActionsContainer,
    f: Field[Any],
    names: Iterable[str] = (),
    *,
    dest: str | None = None,
    choices: Sequence[str] | None = None,
) -> None:
    """The flag of the field ``f`` (with the option strings ``names`` instead of its own, when
    given), stored under ``dest`` (default: the field's name), defaulting to None."""
    options = list(names) or [flag_of(f)]
    kwargs: dict[str, Any] = {"dest": dest or f.name, "help": help_of(f)}
    if f.default is MISSING and f.default_factory is MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = None
    if str(f.type) in ("bool", "bool | None"):
        group.add_argument(*options, action=argparse.BooleanOptionalAction, **kwargs)
        return
    allowed = choices or f.metadata.get("choices")
    if allowed:
        kwargs["choices"] = list(allowed)
    else:
        kwargs["metavar"] = f.metadata.get("metavar") or options[0].lstrip("-").upper().replace(
            "-", "_"
        )
    parse = f.metadata.get("parse") or _TYPES[str(f.type)]
    group.add_argument(*options, type=parse, **kwargs)


def add_flags(
    group: argparse._ActionsContainer,
    cls: type,
    choices: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """One flag per setting of the dataclass ``cls``; ``choices`` by field name, for the
    fields whose choices live where the class cannot import them (a registry)."""
    for f in settings_of(cls):
        add_flag(group, f, choices=(choices or {}).get(f.name))


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The settings of ``cls`` given on the command line (the flags not left out)."""
    values = {f.name: getattr(args, f.name, None) for f in settings_of(cls)}
    return {name: value for name, value in values.items() if value is not None}


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


MEM_FRACTION = 0.85


def mem_fraction_setting() -> Any:
    """``mem_fraction``, declared once for the engine's runner and the simulator: the share of
    each GPU's memory that the weights and the KV pool may take."""
    return setting(
        MEM_FRACTION,
        "share of each GPU's memory the weights and the KV pool may take; the KV pool gets "
        "what the weights leave (the rest: activations, CUDA graphs, the CUDA context)",
        parse=fraction,
    )
