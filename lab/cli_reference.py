"""The command-line reference, ``docs/cli.md``, generated from the parsers themselves.

``python -m lab.cli_reference`` prints the page, ``--write`` writes it and ``--check`` exits 1
when the committed page differs from what the parsers say. The page walks the whole argparse
tree of ``engine`` (``lab.cli.engine.build_parser``) and ``sim`` (``lab.cli.sim.build_parser``):
per command and subcommand its usage, description and a table of every argument with its
default and help. Nothing depends on the terminal: usage is formatted at a fixed width.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import sys
import textwrap
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parents[1] / "docs" / "cli.md"
STALE = "docs/cli.md is stale: run python -m lab.cli_reference --write"
USAGE_WIDTH = 100
HEADER = """\
# Command-line reference

Generated from the parsers of the two console scripts by `python -m lab.cli_reference --write`;
a test fails when this page and the parsers disagree. Each command lists its usage, what it
does and every argument with its default. The subjects behind the flags have their own pages:
[the engine](engine.md), [operating it](operating.md), [the cluster](cluster.md),
[the simulator](simulator.md), [closing the loop](closing_the_loop.md) and [the tools](tools.md).
"""

_CODE_SPAN = re.compile(r"(`+)(.+?)\1")
_MARKUP = re.compile(r"[\\*\[\]|<>]|(?<!\w)_|_(?!\w)")
_ENTITIES = {"<": "&lt;", ">": "&gt;"}
_GENERIC_GROUPS = {"positional arguments", "options", "optional arguments"}


def _plain(value: str) -> str:
    return _MARKUP.sub(lambda m: _ENTITIES.get(m[0], "\\" + m[0]), value)


def _text(value: str) -> str:
    """Markdown-safe text on one line: whitespace collapsed, markup characters escaped outside
    the code spans the text writes itself."""
    one_line = " ".join(value.split())
    out, at = [], 0
    for span in _CODE_SPAN.finditer(one_line):
        out += [_plain(one_line[at : span.start()]), "`" + span[2] + "`"]
        at = span.end()
    out.append(_plain(one_line[at:]))
    return "".join(out)


def _code(value: str) -> str:
    """A table cell in backticks; one with a pipe is plain escaped text instead, since
    Markdown renderers disagree on a pipe inside a code span in a table."""
    if not value:
        return ""
    return _plain(value) if "|" in value else f"`{value}`"


def _metavar(action: argparse.Action) -> str:
    """How the value of an argument is written, from its nargs (nothing for a switch)."""
    if action.nargs == 0:
        return ""
    name: Any = action.metavar
    if name is None:
        name = action.dest if not action.option_strings else action.dest.upper()
    names = list(name) if isinstance(name, tuple) else [str(name)]
    one = names[0]
    nargs = action.nargs
    if nargs is None:
        return one
    if nargs == argparse.OPTIONAL:
        return f"[{one}]"
    if nargs == argparse.ZERO_OR_MORE:
        return f"[{one} ...]"
    if nargs == argparse.ONE_OR_MORE:
        return f"{one} [{one} ...]"
    if nargs == argparse.REMAINDER:
        return "..."
    if nargs == argparse.PARSER:
        return f"{one} ..."
    if isinstance(nargs, int):
        return " ".join(names if len(names) == nargs else [one] * nargs)
    return one


def _spelling(action: argparse.Action) -> str:
    metavar = _metavar(action)
    if not action.option_strings:
        return metavar
    return ", ".join(f"{opt} {metavar}".strip() for opt in action.option_strings)


def _default(action: argparse.Action) -> str:
    value = action.default
    if value is None or value is argparse.SUPPRESS:
        return "required" if action.required and action.option_strings else ""
    if isinstance(action, argparse._StoreTrueAction | argparse._StoreFalseAction):
        return "on" if value else "off"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value)
    return str(value)


def _help(action: argparse.Action, prog: str) -> str:
    """The help text as argparse would show it (``%(default)s`` expanded), plus the choices."""
    text = action.help or ""
    if "%" in text:
        params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
        params["prog"] = prog
        if params.get("choices") is not None:
            params["choices"] = ", ".join(str(c) for c in action.choices or ())
        with contextlib.suppress(KeyError, TypeError, ValueError):
            text = text % params
    out = _text(text)
    if action.choices is not None and not isinstance(action, argparse._SubParsersAction):
        choices = ", ".join(_code(str(c)) for c in action.choices)
        out = f"{out}; one of: {choices}" if out else f"one of: {choices}"
    return out


def _visible(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(
        action, argparse._HelpAction | argparse._SubParsersAction | argparse._VersionAction
    )


def _usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=USAGE_WIDTH, max_help_position=40)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups)
    return formatter.format_help().strip()


def _tables(parser: argparse.ArgumentParser) -> list[str]:
    """One table per argument group that has a visible argument (the group's title above it
    unless it is argparse's generic one)."""
    lines: list[str] = []
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if _visible(a)]
        if not actions:
            continue
        if group.title and group.title not in _GENERIC_GROUPS:
            lines += [f"**{_text(group.title)}**", ""]
            if group.description:
                lines += [_text(group.description), ""]
        lines += ["| argument | default | help |", "|---|---|---|"]
        for action in actions:
            row = (_code(_spelling(action)), _code(_default(action)), _help(action, parser.prog))
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return lines


def _subcommands(
    parser: argparse.ArgumentParser,
) -> Iterator[tuple[str, list[str], str, argparse.ArgumentParser]]:
    """(name, aliases, help, parser) of every subcommand, in the order they were added."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
        names: dict[int, list[str]] = {}
        parsers: dict[int, argparse.ArgumentParser] = {}
        for name, sub in action.choices.items():
            names.setdefault(id(sub), []).append(name)
            parsers[id(sub)] = sub
        for key, (name, *aliases) in names.items():
            yield name, aliases, helps.get(name, ""), parsers[key]


def _prose(parser: argparse.ArgumentParser, value: str) -> list[str]:
    """A description or epilog: laid out as written for a raw formatter (argparse keeps its
    lines), else one paragraph."""
    formatter: Any = parser.formatter_class
    if isinstance(formatter, type) and issubclass(formatter, argparse.RawDescriptionHelpFormatter):
        return ["```text", textwrap.dedent(value).strip("\n"), "```", ""]
    return [_text(value), ""]


def _section(parser: argparse.ArgumentParser, title: str, level: int, summary: str) -> list[str]:
    """The section of one command (titled by its path of command names), then its
    subcommands' a level deeper."""
    lines = [f"{'#' * level} {title}", ""]
    description = parser.description or summary
    if description:
        lines += _prose(parser, description)
    lines += ["```text", _usage(parser), "```", ""]
    lines += _tables(parser)
    subs = list(_subcommands(parser))
    if subs:
        lines += ["| command | what it does |", "|---|---|"]
        for name, aliases, help_text, _ in subs:
            spelled = name + (f" (alias {', '.join(aliases)})" if aliases else "")
            lines.append(f"| {_code(spelled)} | {_text(help_text)} |")
        lines.append("")
    if parser.epilog:
        lines += _prose(parser, parser.epilog)
    for name, _, help_text, sub in subs:
        lines += _section(sub, f"{title} {name}", level + 1, help_text)
    return lines


def render(parsers: Sequence[argparse.ArgumentParser]) -> str:
    """The whole page for these top-level parsers, one section each."""
    lines = [HEADER]
    for parser in parsers:
        lines += _section(parser, parser.prog, 2, "")
    return "\n".join(lines).rstrip() + "\n"


def console_parsers() -> list[argparse.ArgumentParser]:
    """The parsers of the two console scripts (``engine``'s imports every command's module)."""
    from lab.cli.engine import build_parser as engine_parser
    from lab.cli.sim import build_parser as sim_parser

    builders: list[Callable[[], argparse.ArgumentParser]] = [engine_parser, sim_parser]
    return [build() for build in builders]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.cli_reference", description="Generate docs/cli.md from the parsers."
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"write {PAGE.name} in docs/")
    mode.add_argument("--check", action="store_true", help="exit 1 when docs/cli.md is stale")
    args = parser.parse_args(argv)
    page = render(console_parsers())
    if args.write:
        PAGE.write_text(page, encoding="utf-8")
        print(f"wrote {PAGE}")
        return 0
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            print(STALE, file=sys.stderr)
            return 1
        return 0
    sys.stdout.write(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
