"""docs/cli.md is generated from the parsers of ``engine`` and ``sim``: it says what they say."""

from __future__ import annotations

import argparse

from lab.cli_reference import PAGE, STALE, console_parsers, main, render


def test_committed_page_matches_the_parsers() -> None:
    committed = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
    assert committed == render(console_parsers()), STALE


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch, capsys) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text("# an old page\n", encoding="utf-8")
    monkeypatch.setattr("lab.cli_reference.PAGE", stale)
    assert main(["--check"]) == 1
    assert STALE in capsys.readouterr().err
    assert main(["--write"]) == 0
    assert main(["--check"]) == 0


def test_every_command_and_flag_is_on_the_page() -> None:
    """Every subcommand at every depth has a section and every visible option a row."""
    page = render(console_parsers())

    def walk(parser: argparse.ArgumentParser, title: str) -> None:
        assert f"# {title}\n" in page, title
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if name in sub.prog.split():
                        walk(sub, f"{title} {name}")
            elif action.help is not argparse.SUPPRESS and action.option_strings:
                if "-h" in action.option_strings:
                    continue
                assert f"| `{action.option_strings[0]}" in page, (parser.prog, action.dest)

    for parser in console_parsers():
        walk(parser, parser.prog)


def test_argparse_corners_render() -> None:
    """SUPPRESS, BooleanOptionalAction, choices, nargs, nested subcommands and aliases."""
    parser = argparse.ArgumentParser(prog="tool", description="A tool.")
    parser.add_argument("paths", nargs="+", help="inputs")
    parser.add_argument("--mode", choices=["a", "b"], default="a", help="pick (%(default)s)")
    parser.add_argument("--flag", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--pair", nargs=2, metavar=("X", "Y"), help="two | values <here>")
    parser.add_argument("--maybe", nargs="?", const=1)
    parser.add_argument("--hidden", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="cmd")
    inner = sub.add_parser("outer", aliases=["o"], help="the outer one")
    inner.add_subparsers(dest="deep").add_parser("inner", help="deepest")
    page = render([parser])
    assert "| `paths [paths ...]` |  | inputs |" in page
    assert "| `--mode MODE` | `a` | pick (a); one of: `a`, `b` |" in page
    assert "| `--flag, --no-flag` | `on` |" in page
    assert "| `--pair X Y` |  | two \\| values &lt;here&gt; |" in page
    assert "| `--maybe [MAYBE]` |" in page
    assert "--hidden" not in page.split("```")[-1]
    assert "| `outer (alias o)` | the outer one |" in page
    assert "### tool outer\n" in page and "#### tool outer inner\n" in page
