"""The command docs cannot drift from the parsers: every command and every flag of ``fastrun``
is in docs/cli.md, and every flag of ``load_and_run`` in docs/runtime.md (issue 15 item 11)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fastrun.cli import load_and_run
from fastrun.cli.main import build_parser

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for the parser and every sub-command under it."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option not in ("--help", "--version")
            and action.help != argparse.SUPPRESS]


def _section(text: str, path: tuple[str, ...]) -> str:
    """The text under the heading ``## <path>`` (or ``###``), up to the next heading of its
    level or above; the whole page for the top-level command."""
    if not path:
        return text
    lines = text.splitlines()
    title = " ".join(path)
    for index, line in enumerate(lines):
        hashes, _, heading = line.partition(" ")
        if set(hashes) == {"#"} and heading.strip() == title:
            level = len(hashes)
            body = []
            for later in lines[index + 1:]:
                marks = later.partition(" ")[0]
                if set(marks) == {"#"} and len(marks) <= level:
                    break
                body.append(later)
            return "\n".join(body)
    raise AssertionError(f"docs/cli.md has no section '## {title}'")


COMMANDS = [(path, parser) for path, parser in _commands(build_parser())
            if not any(isinstance(a, argparse._SubParsersAction) for a in parser._actions)
            or not path]


@pytest.mark.parametrize("path, parser", COMMANDS,
                         ids=lambda value: " ".join(value) if isinstance(value, tuple) else "")
def test_every_fastrun_command_and_flag_is_documented(path, parser) -> None:
    """Each command has its own section (``## profile``, ``### cache show``), which names
    every one of its flags."""
    section = _section((DOCS / "cli.md").read_text(), path)
    missing = [flag for flag in _flags(parser) if flag not in section]
    assert not missing, f"docs/cli.md's section on `fastrun {' '.join(path)}` lacks {missing}"


def test_every_load_and_run_flag_is_documented() -> None:
    text = (DOCS / "runtime.md").read_text()
    missing = [flag for flag in _flags(load_and_run.build_parser()) if flag not in text]
    assert not missing, f"docs/runtime.md lacks {missing}"
