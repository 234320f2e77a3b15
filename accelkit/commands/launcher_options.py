"""The launcher options `accelkit launch` and `accelkit bench` share, defined (and checked) once: where the config
comes from, CPU rehearsal, `-m`, and torchrun's rendezvous settings. A bad rendezvous value is refused here, before
any process starts, in both commands alike."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from accelkit.commands.config_options import nonempty_path

# The rendezvous handlers torch registers (torch.distributed.elastic.rendezvous.registry).
RDZV_BACKENDS = ("static", "c10d", "etcd", "etcd-v2")


def rdzv_conf(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """KEY=VALUE pairs separated by commas, as torchrun parses them (checked here, before any process starts)."""
    if value is None:
        return None
    for pair in value.split(","):
        key, _, setting = pair.partition("=")
        if pair and (not key.strip() or not setting.strip()):
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE; write KEY=VALUE pairs separated by commas, e.g. "
                                     "join_timeout=900,read_timeout=60", ctx=ctx, param=param)
    return value


CONFIG_HELP = ("Start from this Accelerate config (e.g. from `accelkit config -o`); options given here override its "
               "values.")
CPU_HELP = ("Run N real processes on CPU over gloo for any backend (DDP, FSDP and DeepSpeed are rehearsed with their "
            "real code).")


def config_file_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--config FILE` (the parameter `config_file`)."""
    return click.option("--config", "config_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        metavar="FILE", callback=nonempty_path, help=CONFIG_HELP)(func)


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--cpu` and `-m/--module`: how the script runs."""
    func = click.option("-m", "--module", is_flag=True, default=False,
                        help="SCRIPT is a module name, run like `python -m`.")(func)
    return click.option("--cpu", is_flag=True, default=False, help=CPU_HELP)(func)


def rendezvous_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--rdzv-backend`, `--rdzv-conf`, `--same-network`: torchrun's rendezvous (multi-node)."""
    func = click.option("--same-network", is_flag=True, default=None,
                        help="All machines share one local network (torchrun uses master address/port directly).")(func)
    func = click.option("--rdzv-conf", default=None, metavar="K=V,...", callback=rdzv_conf,
                        help="Extra rendezvous settings for torchrun.")(func)
    return click.option("--rdzv-backend", type=click.Choice(RDZV_BACKENDS), default=None,
                        help="torchrun rendezvous backend. Default: static.")(func)
