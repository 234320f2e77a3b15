"""Placeholder until this command lands."""

import click

from accelkit.errors import AccelkitError


@click.command(name="init")
def command() -> None:
    """(not yet implemented)"""
    raise AccelkitError("this command is not implemented yet")
