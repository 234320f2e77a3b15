"""Option types shared by the commands."""

from __future__ import annotations

import math
from typing import Any

import click


class Seconds(click.FloatRange):
    """A duration in seconds: a finite number in the range. click's FloatRange lets `nan` through (every comparison
    with it is false) and `inf`; neither is a time a watchdog can wait."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds (give a finite number, e.g. 60)", param, ctx)
        return number
