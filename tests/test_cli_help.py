"""Every command's help reads as whole sentences: in `graphdiff --help`'s list of commands (where the docstring's
own line breaks used to cut sentences into rows), in its own `--help`, and in shell completion's short help."""

from __future__ import annotations

import inspect

import pytest
import typer
from typer.testing import CliRunner

from graphdiff_cli.cli.app import app

GROUP = typer.main.get_command(app)
COMMANDS = sorted(GROUP.commands)


def _first_paragraph(cmd) -> str:
    return " ".join(inspect.cleandoc(cmd.help or "").partition("\f")[0].split("\n\n")[0].split())


@pytest.fixture
def wide(monkeypatch):
    """Help laid out 1,000 columns wide: every sentence fits on one row, so a row break is a break in the text."""
    from typer import rich_utils

    monkeypatch.setattr(rich_utils, "MAX_WIDTH", 1000)


def test_every_command_has_a_first_paragraph_of_whole_sentences():
    for name in COMMANDS:
        first = _first_paragraph(GROUP.commands[name])
        assert first and first[0].isupper() and first.endswith((".", "?", "!")), (name, first)


def test_the_command_list_shows_each_first_paragraph_whole(wide):
    res = CliRunner().invoke(app, ["--help"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if "Commands" in line)
    rows = [line.strip("│ ").rstrip() for line in lines[start + 1:] if line.startswith("│")]
    assert len(rows) == len(COMMANDS), rows  # one row per command: no row continues a cut sentence
    for name, row in zip(COMMANDS, sorted(rows)):
        assert row.split()[0] == name and " ".join(row.split()[1:]) == _first_paragraph(GROUP.commands[name]), row


@pytest.mark.parametrize("name", COMMANDS)
def test_each_commands_own_help_starts_with_its_first_paragraph_on_one_line(wide, name):
    res = CliRunner().invoke(app, [name, "--help"])
    assert res.exit_code == 0, res.stdout
    assert _first_paragraph(GROUP.commands[name]) in [line.strip() for line in res.stdout.splitlines()]


def test_completion_short_help_is_not_cut_mid_sentence():
    for name in COMMANDS:
        cmd = GROUP.commands[name]
        assert cmd.get_short_help_str(limit=45) == _first_paragraph(cmd), name
