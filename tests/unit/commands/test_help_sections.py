"""`--help` in sections (issue 45): every option of launch, bench and config is under a named heading, declared in
accelkit/commands/help_sections.py, and the headings come in one order; the other commands keep one Options list."""

from __future__ import annotations

import re

import click
import pytest
from click.testing import CliRunner

from accelkit.cli import COMMANDS, cli, docs_link
from accelkit.commands.help_sections import (
    COMMAND_SECTION_OF,
    SECTION_OF,
    SECTIONED,
    SECTIONS,
    UNSECTIONED,
    option_flag,
    section_of,
)


def _command(name: str) -> click.Command:
    command = cli.get_command(click.Context(cli), name)
    assert command is not None
    return command


def _shown_options(command: click.Command) -> list[click.Option]:
    with click.Context(command) as ctx:
        return [p for p in command.get_params(ctx) if isinstance(p, click.Option) and p.get_help_record(ctx)]


def _help(name: str) -> str:
    result = CliRunner().invoke(cli, [name, "--help"], prog_name="accelkit", terminal_width=110)
    assert result.exit_code == 0, result.output
    return result.output


def _headings(text: str) -> list[str]:
    return [line[:-1] for line in text.splitlines() if line.endswith(":") and not line.startswith(" ")]


def _listed_under(text: str) -> dict[str, str]:
    """Each option row of a --help (its longest flag) -> the heading above it."""
    listed, heading = {}, None
    for line in text.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            heading = line[:-1]
        elif line.startswith("  -") and heading is not None:
            flags = re.findall(r"--?[\w-]+", line.split("  ")[1].split(" [")[0].split(" / ")[0])  # not --no-X
            listed[max(flags, key=len)] = heading
    return listed


@pytest.mark.parametrize("name", SECTIONED)
def test_every_option_of_a_sectioned_command_has_a_section(name: str) -> None:
    missing = [option_flag(p) for p in _shown_options(_command(name)) if section_of(name, p) is None]
    assert missing == [], (
        f"`accelkit {name}` options without a --help section: {missing}. Add each to SECTION_OF (or, where the flag "
        f"means something else in `{name}`, to COMMAND_SECTION_OF[{name!r}]) in accelkit/commands/help_sections.py.")


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_shown_option_is_listed_under_a_heading(name: str) -> None:
    """Every option --help shows sits under a heading, and no sectioned command falls back to the catch-all."""
    listed = _listed_under(_help(name))
    for option in _shown_options(_command(name)):
        flag = option_flag(option)
        expected = section_of(name, option) if name in SECTIONED else UNSECTIONED
        assert listed.get(flag) == expected, f"{name}: {flag} is under {listed.get(flag)!r}, not {expected!r}"
    if name in SECTIONED:
        assert UNSECTIONED not in listed.values()


@pytest.mark.parametrize(("name", "expected"), [
    ("launch", ["Config and backend", "Resources (processes and machines)", "Running (CPU rehearsal, module, dry run)",
                "FSDP backend", "DeepSpeed backend", "N-D parallelism", "Gradient compression",
                "Supervision and rendezvous", "Cluster job (written instead of launching)",
                "Cluster job resources, environment and storage",
                "Ray cluster (run on its workers instead of this machine)", "Help"]),
    ("bench", ["Config and backend", "Resources (processes and machines)", "Sweep (what each run varies)",
               "Measurement", "Running (CPU rehearsal, module, dry run)", "FSDP backend", "DeepSpeed backend",
               "N-D parallelism", "Gradient compression", "Supervision and rendezvous", "Output", "Help"]),
    ("config", ["Config and backend", "Resources (processes and machines)", "FSDP backend", "DeepSpeed backend",
                "N-D parallelism", "Gradient compression", "Output", "Help"]),
])
def test_sectioned_help_shows_its_headings_in_order_and_keeps_its_docs_footer(name: str, expected: list[str]) -> None:
    text = _help(name)
    assert _headings(text) == expected
    assert [SECTIONS.index(h) for h in expected] == sorted(SECTIONS.index(h) for h in expected)
    assert text.rstrip().splitlines()[-1].strip() == docs_link(name)
    assert text.count(" --help ") == 1  # each option once


def test_a_flag_two_commands_use_differently_is_sectioned_per_command() -> None:
    force = {name: section_of(name, next(p for p in _shown_options(_command(name)) if option_flag(p) == "--force"))
             for name in SECTIONED}
    assert force == {"config": "Output", "bench": "Output", "launch": "Cluster job (written instead of launching)"}
    assert "--force" not in SECTION_OF  # no default that a command could silently inherit


def test_the_tables_name_only_headings_that_exist_and_options_that_exist() -> None:
    sections = {*SECTION_OF.values(), *(s for table in COMMAND_SECTION_OF.values() for s in table.values())}
    assert sections <= set(SECTIONS)
    flags = {option_flag(p) for name in SECTIONED for p in _shown_options(_command(name))}
    stale = {*SECTION_OF, *(f for table in COMMAND_SECTION_OF.values() for f in table)} - flags
    assert stale == set(), f"help_sections.py names options no sectioned command has: {sorted(stale)}"
