"""The config options shared by `accelkit config` and `accelkit launch`, made from ConfigOptions' own table.

Each option's flag, type, choices, metavar and help come from the metadata of its ConfigOptions field
(accelkit/configs/options.py), so a new option is one field there. Imports only click and that light module:
`accelkit --help` stays fast. Every option defaults to None, meaning "not given".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import Field
from pathlib import Path
from typing import Any

import click

from accelkit.configs import OPTION_FLAGS, ConfigOptions


def nonempty_path(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """Refuse an empty path (`-o ""`), which would otherwise mean the current folder."""
    if value is not None and str(value) in ("", "."):
        raise click.BadParameter("the path is empty; give a file name", ctx=ctx, param=param)
    return value


def _to_int(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    return None if value is None else int(value)


class PipelineSchedule(click.ParamType):
    """`--pp-schedule` of config, launch, bench and plan: any spelling accelkit.pipeline_schedules accepts, given
    back as the name configs carry (`Interleaved1F1B` -> `interleaved1f1b`); anything else is refused there, in the
    one message of every command."""

    name = "schedule"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        from accelkit.pipeline_schedules import parse_schedule

        return parse_schedule(str(value)).name


def _click_option(flag: str, f: Field) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    meta = f.metadata
    kind, choices, help_text = meta["kind"], meta["choices"], meta["help"]
    common: dict[str, Any] = {"default": None, "help": help_text}
    if meta["metavar"]:
        common["metavar"] = meta["metavar"]
    if kind == "switch":
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, **common)
    if kind == "many":
        return click.option(flag, f.name, multiple=True, **{**common, "default": ()})
    if kind == "choice" and all(isinstance(c, int) for c in choices):
        return click.option(flag, f.name, type=click.Choice([str(c) for c in choices]), callback=_to_int, **common)
    if kind == "choice":
        return click.option(flag, f.name, type=click.Choice(list(choices)), **common)
    if kind == "schedule":
        return click.option(flag, f.name, type=PipelineSchedule(), **common)
    if kind == "int":
        return click.option(flag, f.name, type=int, **common)
    if kind == "path":
        return click.option(flag, f.name, type=click.Path(dir_okay=False, path_type=Path), callback=nonempty_path,
                            **common)
    if kind == "model":  # a file or a folder
        return click.option(flag, f.name, type=click.Path(path_type=Path), callback=nonempty_path, **common)
    return click.option(flag, f.name, **common)


def config_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator adding the shared config options to a click command (in the table's order)."""
    return config_options_except()(func)


def config_options_except(*names: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Like config_options, without the options named (a command that spells one of them its own way, e.g.
    `accelkit bench --num-processes 1,2,4,8`)."""

    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for flag, f in reversed(list(OPTION_FLAGS.items())):
            if f.name not in names:
                func = _click_option(flag, f)(func)
        return func

    return decorate


def options_from_kwargs(kwargs: dict[str, Any]) -> ConfigOptions:
    """Pop the shared options out of a click callback's kwargs and return them as a ConfigOptions."""
    values = {f.name: kwargs.pop(f.name) for f in OPTION_FLAGS.values() if f.name in kwargs}
    values["wrap_cls"] = tuple(values.get("wrap_cls") or ())
    return ConfigOptions(**values)
