"""The end of every command: print what the library returned, in order, and exit with its code; and the one way a
library call says what it is doing while it runs."""

from __future__ import annotations

import click

from accelkit.command_result import CommandResult


def finish(result: CommandResult) -> int:
    """Print `result`'s lines on their streams, raise its error (after the lines), return its exit status."""
    for line in result.lines:
        click.echo(line.text, err=line.err, nl=line.nl)
    if result.error is not None:
        raise result.error
    return result.exit_code


def progress(line: str) -> None:
    """A line said while the work goes on (before a long run, between runs): on stderr, at once."""
    click.echo(line, err=True)
