"""The commands that run the user's script (launch, bench, plan --measure, convert --check), and the script's own
arguments, read one way.

The script's arguments arrive in the command's `script_args` parameter, a tuple of words:
- where SCRIPT is an argument (launch, bench, convert), the words after SCRIPT that accelkit does not take
  (launch and bench take none after SCRIPT: every word goes to the script; convert still reads its own options);
- where SCRIPT is an option's value (plan --measure SCRIPT), the words after `--`.
Either way a `--` that ends accelkit's words is ours and dropped; every word after it reaches the script as typed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from accelkit.commands.vocabulary import AccelkitCommand

SEPARATOR = "--"


class ScriptCommand(AccelkitCommand):
    """A command that runs a script with arguments of its own (see the module's docstring)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if not any(param.name == "script_args" for param in self.params):  # plan: `-- ARGS` after every option
            split = args.index(SEPARATOR) if SEPARATOR in args else len(args)
            args, after = args[:split], tuple(args[split + 1:])
            rest = super().parse_args(ctx, args)
            ctx.params["script_args"] = after
            return rest
        rest = super().parse_args(ctx, args)
        words = tuple(ctx.params.get("script_args") or ())
        ctx.params["script_args"] = words[1:] if words[:1] == (SEPARATOR,) else words  # `SCRIPT -- ARGS`
        return rest


def script_args_argument() -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """The `[SCRIPT_ARGS]...` argument: every word after SCRIPT, unparsed."""
    return click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[SCRIPT_ARGS]...")
