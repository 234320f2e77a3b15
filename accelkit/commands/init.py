"""`accelkit init`: copy a training template into a new project, with an Accelerate config and a README."""

from __future__ import annotations

from pathlib import Path

import click

from accelkit.commands.printing import finish
from accelkit.commands.vocabulary import AccelkitCommand
from accelkit.configs import Backend


@click.command(name="init", cls=AccelkitCommand)
@click.argument("directory", type=click.Path(path_type=Path), required=False)
@click.option("-t", "--template", "template", metavar="NAME", default=None,
              help="Template to copy (see --list).")
@click.option("--backend", type=click.Choice(Backend.values()), default="ddp", show_default=True,
              help="Backend of the Accelerate config written beside train.py.")
@click.option("--num-processes", type=click.IntRange(min=1), default=None, metavar="N",
              help="Total processes in that config. Default: the GPUs found here, else 2 (1 for single/cpu).")
@click.option("--force", is_flag=True, help="Write into a non-empty DIRECTORY (files with the template's names "
                                            "are replaced; others are kept).")
@click.option("--list", "list_", is_flag=True, help="List the templates with their descriptions and exit.")
def command(directory: Path | None, template: str | None, backend: str, num_processes: int | None, force: bool,
            list_: bool) -> int:
    """Scaffold a training project from a template: train.py, its data, an Accelerate config, a README.

    \b
      accelkit init my-run --template causal-lm --backend fsdp
      accelkit init --list

    Every template trains a tiny model offline in seconds with no arguments, runs under DDP, FSDP and DeepSpeed,
    checkpoints to outputs/checkpoint-<step>, resumes exactly, and saves outputs/final for from_pretrained.
    """
    if list_ and (directory is not None or template is not None):
        raise click.UsageError("--list takes no other arguments")
    if directory is None and not list_:
        raise click.UsageError("missing DIRECTORY (or pass --list)")
    from accelkit.scaffold import run_init

    return finish(run_init(directory, template, backend=backend, num_processes=num_processes, force=force,
                           listing=list_))
