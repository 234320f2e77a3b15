"""The options of supervised runs, parsed in one place for every command that runs a job (launch, bench,
plan --measure, convert --check): a number of seconds is finite (`nan` and `inf` are refused, not turned into a
watchdog that fires after a second or never), and `--stall-timeout` means the same everywhere."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import click


class Seconds(click.ParamType):
    """A finite number of seconds, at least `minimum` and at most `maximum` (default: 30 days, accelkit/limits.py)."""

    name = "seconds"

    def __init__(self, minimum: float = 0.0, maximum: float | None = None) -> None:
        from accelkit.limits import MAX_SECONDS

        self.minimum = minimum
        self.maximum = MAX_SECONDS if maximum is None else maximum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        else:
            try:
                number = float(str(value).strip())
            except ValueError:
                self.fail(f"{value!r} is not a number of seconds", param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number of seconds; give a number such as 60"
                      + (" (0 turns it off)" if self.minimum == 0 else ""), param, ctx)
        if number < self.minimum:
            self.fail(f"{value!r} is less than {self.minimum:g} second(s)", param, ctx)
        if number > self.maximum:
            self.fail(f"{value!r} seconds is more than {self.maximum / 86400:g} days, longer than any run needs; give "
                      "a number such as 600", param, ctx)
        return number


STALL_TIMEOUT_HELP = ("Stall watchdog: when for this long no rank printed, read, wrote or stepped an optimizer and a "
                      "rank sat idle, print every rank's Python stack and where they wait, stop the job")


def stall_timeout_option(effect: str = "exit 124",
                         default_help: str = "Default: 300 on CPU (rehearsals), 1800 on GPUs; 0 turns it off."
                         ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--stall-timeout SECONDS` (None when not given: the supervisor's default for the job's kind)."""
    return click.option("--stall-timeout", type=Seconds(), default=None, metavar="SECONDS",
                        help=f"{STALL_TIMEOUT_HELP}, {effect}. {default_help}")
