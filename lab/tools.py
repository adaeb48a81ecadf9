"""The parser every ``sim`` tool shares: its module's docstring as the description and its
example as the epilog, both printed as written; and a group of such tools under one command
(``sim profile``, ``sim colocation``, ``sim trace``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


class Tool(Protocol):
    """A tool's module: ``add_parser(sub)`` adds its subparser to ``sub`` and sets ``func``;
    ``EXAMPLE`` is what its ``--help`` prints after the flags, a heading line first."""

    EXAMPLE: str

    def add_parser(self, sub: Subparsers) -> None: ...


def add_tool(
    sub: Subparsers, name: str, *, help: str, doc: str | None, example: str
) -> argparse.ArgumentParser:
    """The subparser ``name`` in ``sub``: ``help`` its line in the list of commands, ``doc``
    (the tool module's ``__doc__``) and ``example`` what its ``--help`` prints around the flags."""
    return sub.add_parser(
        name,
        help=help,
        description=doc,
        epilog=example,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def add_tool_group(
    sub: Subparsers, name: str, *, help: str, doc: str | None, tools: Sequence[Tool]
) -> None:
    """The command ``sim NAME`` whose subcommands are ``tools``, in order: ``doc`` (the group
    module's ``__doc__``) its description, and every tool's examples after the list."""
    examples = "".join(line + "\n" for tool in tools for line in tool.EXAMPLE.splitlines()[1:])
    example = f"examples:\n{examples}(sim {name} COMMAND --help: its flags)"
    group = add_tool(sub, name, help=help, doc=doc, example=example)
    tool_parsers = group.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")
    for tool in tools:
        tool.add_parser(tool_parsers)
