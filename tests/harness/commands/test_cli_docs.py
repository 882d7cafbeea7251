"""docs/cli.md and ``--help`` match the parsers: every command and every flag that ``crl``'s
argparse parsers define is in docs/cli.md, in the entries of its own command, and no ``--help``
prints reStructuredText markup."""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from crl_harness.cli import build_parser

CLI_DOC = Path(__file__).resolve().parents[3] / "docs" / "cli.md"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("crl",),
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser of the ``crl`` tree with its command words, leaves and inner nodes alike."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _commands(child, (*path, name))


COMMANDS = dict(_commands(build_parser()))


def _entries(command: str) -> str:
    """The text of docs/cli.md's entries (list items, continued lines included) that begin with
    the command, e.g. "- `crl eval ..."; a shorter command's entries are not a longer one's."""
    found: list[str] = []
    current: list[str] | None = None
    for line in CLI_DOC.read_text().splitlines():
        if line.startswith("- ") or line.startswith("#") or not line.strip():
            if current is not None:
                found.append(" ".join(current))
            current = [line] if re.match(rf"- `{re.escape(command)}( |`)", line) else None
        elif current is not None:
            current.append(line)
    if current is not None:
        found.append(" ".join(current))
    return "\n".join(found)


def _names(action: argparse.Action) -> list[str]:
    """How docs/cli.md may name an argument: its longest option string, or for a positional its
    metavar, its name in capitals or one of its choices."""
    if action.option_strings:
        return [max(action.option_strings, key=len)]
    return [str(action.metavar or ""), action.dest.upper(), *map(str, action.choices or [])]


@pytest.mark.parametrize("words", [w for w, p in COMMANDS.items()
                                   if not p._subparsers or len(w) == 1],
                         ids=" ".join)
def test_cli_doc_lists_every_command_and_flag(words):
    command = " ".join(words)
    if len(words) == 1:  # `crl` itself: its own flags are written `crl --version`
        text = CLI_DOC.read_text()
        names = [f"crl {a.option_strings[-1]}" for a in COMMANDS[words]._actions
                 if a.option_strings and not isinstance(a, argparse._HelpAction)]
    else:
        text = _entries(command)
        assert text, f"docs/cli.md has no entry beginning with `{command}`"
        names = [_names(a) for a in COMMANDS[words]._actions
                 if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]
    for name in names:
        options = name if isinstance(name, list) else [name]
        assert any(re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text) for o in options if o), (
            f"docs/cli.md: the entries of `{command}` do not mention {options[0]}")


def test_the_entries_of_a_command_are_its_own():
    assert "--history" in _entries("crl eval") and "--history" not in _entries("crl train")
    assert _entries("crl swe filter") and "--rootfs" not in _entries("crl swe filter")


@pytest.mark.parametrize("words", list(COMMANDS), ids=" ".join)
def test_help_is_plain_text(words):
    assert "`" not in COMMANDS[words].format_help(), f"{' '.join(words)} --help prints backticks"
