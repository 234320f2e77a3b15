"""The `accelkit` command group.

Commands live in accelkit/commands/<module>.py and are imported only when used (or when their one-line help
is listed); heavy libraries (torch, accelerate, ...) are imported inside the functions that need them, so
`accelkit --help` starts in a fraction of the time `accelerate --help` takes.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import NoReturn

import click

from accelkit import __version__
from accelkit.errors import (
    DEBUG_ENV,
    AccelkitError,
    Terminated,
    debug_enabled,
    raise_on_termination,
    raise_pending_termination,
    report,
)

# command name -> module under accelkit.commands; listed in the order `accelkit --help` shows them.
COMMANDS: dict[str, str] = {
    "init": "init",
    "config": "config",
    "launch": "launch",
    "merge-ckpt": "merge_ckpt",
    "convert": "convert",
    "plan": "plan",
    "bench": "bench",
    "env": "env",
}

# Where the manual lives. No hosted copy of the site exists, so the links are the pages' paths in the source tree
# (docs/, rendered by `mkdocs serve`); once the site is published, its URL goes here and every --help follows.
DOCS_BASE = "docs/"


def docs_link(command_name: str | None = None) -> str:
    """The manual's page for a command (docs/commands/<name>.md), or its front page."""
    page = f"commands/{command_name}.md" if command_name else "index.md"
    return f"Docs: {DOCS_BASE}{page}"


class LazyGroup(click.Group):
    """A click group that imports a command's module only when the command is needed, and prints an
    AccelkitError as one message (under main() and click's CliRunner alike)."""

    def invoke(self, ctx: click.Context):
        try:
            code = super().invoke(ctx)
        except AccelkitError as error:
            if debug_enabled():
                raise
            ctx.exit(report(error))
        if isinstance(code, int) and code:  # a command returns its exit status: the same under main() and CliRunner
            ctx.exit(code)
        return code

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = COMMANDS.get(cmd_name)
        if module_name is None:
            return None
        module = importlib.import_module(f"accelkit.commands.{module_name}")
        command = module.command
        link = docs_link(cmd_name)
        if link not in (command.epilog or ""):  # every --help ends with the command's page of the manual
            command.epilog = f"{command.epilog}\n\n{link}" if command.epilog else link
        return command


@click.group(cls=LazyGroup, epilog=docs_link(),
             context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "-V", "--version", prog_name="accelkit")
def cli() -> None:
    """accelkit: take a training script from one GPU to many, and back to one checkpoint.

    \b
      accelkit init my-run --template causal-lm --backend fsdp
      accelkit config --backend fsdp --num-processes 8 -o fsdp.yaml
      accelkit launch --backend fsdp my-run/train.py -- --max-steps 1000
      accelkit merge-ckpt my-run/outputs/checkpoint-1000 -o merged/

    Set ACCELKIT_DEBUG=1 to see full tracebacks.
    """


def _exit_stopped(code: int) -> NoReturn:
    """Exit at once once a signal has stopped the command and its cleanup has run (while the exception unwound).
    The interpreter's own teardown is skipped: it puts the signal handlers back to their defaults and ends what
    native threads are left by force, and under load a merge stopped mid-way then aborted there after saying
    "Terminated" ('terminate called without an active exception', exit 134 instead of 129)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe or stream: nothing more can be said on it
            stream.flush()
    os._exit(code)


def _ignore_further_stops() -> None:
    """The command was stopped by a signal and exits with 128 + that signal. A further Ctrl-C (or SIGTERM) sent while it
    says so and exits must not end it with a KeyboardInterrupt status (-2) or a traceback: the stop was already
    honoured. Seen in CI: two SIGINTs 0.3 s apart, the job ended between them, accelkit exited -2."""
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user mistakes become one message and a non-zero exit, never a traceback."""
    raise_on_termination()  # SIGTERM/SIGHUP unwind like Ctrl-C: temporary outputs are removed on the way out
    try:
        rv = cli.main(args=argv, prog_name="accelkit", standalone_mode=False)
        raise_pending_termination()  # a signal that landed in the command's last import
        if isinstance(rv, int) and rv > 128:
            _ignore_further_stops()
    except click.exceptions.Abort as exc:
        _ignore_further_stops()
        if isinstance(exc.__cause__, KeyboardInterrupt):  # click turns a Ctrl-C into Abort
            click.echo("Interrupted.", err=True)
            _exit_stopped(130)
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:  # click's usage errors (exit code 2)
        exc.show()
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        _ignore_further_stops()
        click.echo("Interrupted.", err=True)
        _exit_stopped(130)
    except Terminated as exc:
        import signal

        _ignore_further_stops()
        # SIGINT reaches here when a supervised child (plan --measure's ranks) was stopped by Ctrl-C: say it as
        # Ctrl-C is said everywhere else
        click.echo("Interrupted." if exc.signum == signal.SIGINT else f"Terminated (signal {exc.signum}).", err=True)
        _exit_stopped(exc.exit_code)
    except Exception as exc:  # a bug or an environment problem we did not anticipate
        if debug_enabled():
            raise
        click.echo(f"Error: {type(exc).__name__}: {exc}", err=True)
        click.echo(f"  Hint: rerun with {DEBUG_ENV}=1 for the full traceback.", err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)


if __name__ == "__main__":
    main()
