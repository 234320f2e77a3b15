"""One command-line vocabulary across commands: the spelling --help shows, and the older spellings that keep working.

The commands once spelled one thing several ways (`plan --nodes` / `config --num-machines`, `plan --gpus` /
`launch --num-processes`, `plan --precision bf16-mixed` / `launch --mixed-precision bf16`). Each concept now has one
spelling, the one `accelerate launch` uses; the others stay as hidden aliases (accepted, not in --help) so no command
a user wrote breaks. Values have aliases too: `--mixed-precision bf16-mixed` is `--mixed-precision bf16`.

Every accelkit command is an `AccelkitCommand`: it adds the hidden alias options of its row of ALIASES, and after
parsing folds each alias into the option it spells (an alias and its option given with different values is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import click
from click.core import ParameterSource

from accelkit.errors import AccelkitError


@dataclass(frozen=True)
class Alias:
    """`spelling` is another way to write `canonical`; `values` maps this spelling's own values to canonical ones
    (where the old spelling meant something else by the same word: `plan --precision bf16` is pure bf16)."""

    spelling: str
    canonical: str
    values: Mapping[str, str] = field(default_factory=dict)


# Lightning-style precision names (what `plan --precision` took), accepted wherever a mixed precision is asked.
MIXED_PRECISION_VALUES = {"bf16-mixed": "bf16", "fp16-mixed": "fp16", "fp32": "no"}

# canonical flag -> {old value: canonical value}; applies to that flag in every command that has it.
VALUE_ALIASES: dict[str, Mapping[str, str]] = {"--mixed-precision": MIXED_PRECISION_VALUES}

# `accelerate launch` accepts both `--config_file` and `--config-file` for what accelkit calls `--config`.
_CONFIG_FILE = (Alias("--config-file", "--config"), Alias("--config_file", "--config"))
# `accelerate launch`'s underscore spellings of the options accelkit shares with it by name.
_ACCELERATE_CONFIG = tuple(Alias("--" + name, "--" + name.replace("_", "-")) for name in (
    "num_processes", "num_machines", "machine_rank", "main_process_ip", "main_process_port", "mixed_precision",
    "gradient_accumulation_steps", "fsdp_version", "zero_stage"))
_ACCELERATE_LAUNCHER = tuple(Alias("--" + name, "--" + name.replace("_", "-")) for name in (
    "rdzv_backend", "rdzv_conf", "same_network"))

# command name -> its aliases. Where two commands shared a concept under two names, the alias keeps the other one.
ALIASES: dict[str, tuple[Alias, ...]] = {
    "config": _ACCELERATE_CONFIG,
    "launch": (Alias("--nodes", "--num-machines"), *_CONFIG_FILE, *_ACCELERATE_CONFIG, *_ACCELERATE_LAUNCHER,
               Alias("--max_restarts", "--max-restarts"), Alias("--monitor_interval", "--monitor-interval")),
    "bench": (*_CONFIG_FILE, *_ACCELERATE_CONFIG, *_ACCELERATE_LAUNCHER),
    "plan": (Alias("--nodes", "--num-machines"), Alias("--gpus", "--num-processes"),
             Alias("--precision", "--mixed-precision", {"bf16": "bf16-true"}),
             Alias("--num_processes", "--num-processes"), Alias("--num_machines", "--num-machines"),
             Alias("--mixed_precision", "--mixed-precision")),
    "convert": (Alias("--mixed_precision", "--mixed-precision"),),
    "init": (Alias("--num_processes", "--num-processes"),),
}


class AliasedChoice(click.Choice):
    """A choice that also accepts hidden old values, each read as its canonical value (--help lists only those)."""

    def __init__(self, choices: Any, aliases: Mapping[str, str]) -> None:
        super().__init__(list(choices))
        self.aliases = dict(aliases)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        return super().convert(self.aliases.get(value, value) if isinstance(value, str) else value, param, ctx)


class AliasOption(click.Option):
    """A hidden option spelling `target` another way; its value lands in `target` after parsing."""

    def __init__(self, alias: Alias, target: click.Option) -> None:
        self.alias, self.target = alias, target
        settings: dict[str, Any] = {"hidden": True, "callback": target.callback, "metavar": target.metavar}
        if target.is_flag:
            settings.update(is_flag=True, flag_value=target.flag_value, default=None)
        else:
            value_type = target.type
            if isinstance(value_type, click.Choice):
                values = {**VALUE_ALIASES.get(alias.canonical, {}), **alias.values}
                value_type = AliasedChoice(value_type.choices, values)
            settings.update(type=value_type, multiple=target.multiple, default=() if target.multiple else None)
        name = f"{target.name}__as_{alias.spelling.lstrip('-').replace('-', '_')}"
        super().__init__([alias.spelling, name], **settings)


class AccelkitCommand(click.Command):
    """A click command speaking the one vocabulary: hidden aliases from ALIASES, value aliases from VALUE_ALIASES."""

    def __init__(self, name: str | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(name, *args, **kwargs)
        by_flag = {opt: param for param in self.params if isinstance(param, click.Option) for opt in param.opts}
        for param in list(by_flag.values()):
            values = next((VALUE_ALIASES[opt] for opt in param.opts if opt in VALUE_ALIASES), None)
            if values is not None and isinstance(param.type, click.Choice):
                param.type = AliasedChoice(param.type.choices, values)
        for alias in ALIASES.get(name or "", ()):
            target = by_flag.get(alias.canonical)
            if target is None:  # the table names a flag this command does not have: a bug, caught by the tests
                raise LookupError(f"{name} has no option {alias.canonical} for the alias {alias.spelling}")
            if alias.spelling not in by_flag:
                self.params.append(AliasOption(alias, target))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        rest = super().parse_args(ctx, args)
        fold_aliases(ctx)
        return rest

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """launch, bench and config list their options by concern (accelkit/commands/help_sections.py)."""
        from accelkit.commands.help_sections import SECTIONED, format_sections

        if self.name in SECTIONED:
            format_sections(self, ctx, formatter)
        else:
            super().format_options(ctx, formatter)


def fold_aliases(ctx: click.Context) -> None:
    """Move each alias's value into the option it spells; an alias and its option disagreeing is refused."""
    for param in ctx.command.params:
        if not isinstance(param, AliasOption):
            continue
        value = ctx.params.pop(param.name, None)
        if value is None or value == ():
            continue
        target, alias = param.target, param.alias
        given = ctx.params.get(target.name)
        if ctx.get_parameter_source(target.name) is ParameterSource.COMMANDLINE and given != value:
            raise AccelkitError(f"{alias.spelling} {_spell(value)} and {alias.canonical} {_spell(given)} disagree",
                                hint=f"{alias.spelling} is another spelling of {alias.canonical}: give one of them")
        ctx.params[target.name] = value
        ctx.set_parameter_source(target.name, ParameterSource.COMMANDLINE)


def _spell(value: object) -> str:
    return " ".join(map(str, value)) if isinstance(value, (tuple, list)) else str(value)


def hidden_spellings(command: click.Command) -> list[str]:
    """The alias spellings a command accepts without showing them (for tests and docs)."""
    return [param.alias.spelling for param in command.params if isinstance(param, AliasOption)]
