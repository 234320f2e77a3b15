"""`accelkit init`: copy a training template into a new project, with an Accelerate config and a README."""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from accelkit.commands.vocabulary import AccelkitCommand
from accelkit.configs import Backend
from accelkit.errors import AccelkitError


def _list_templates() -> int:
    from accelkit.scaffold import list_templates

    templates = list_templates()
    width = max((len(t.name) for t in templates), default=0)
    for template in templates:
        click.echo(f"{template.name.ljust(width)}  {template.description}")
    click.echo("\nStart a project with `accelkit init DIR --template NAME [--backend B]`.", err=True)
    return 0


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
    if list_:
        if directory is not None or template is not None:
            raise click.UsageError("--list takes no other arguments")
        return _list_templates()
    if directory is None:
        raise click.UsageError("missing DIRECTORY (or pass --list)")
    if template is None:
        raise AccelkitError("no template given", hint="pass --template NAME; `accelkit init --list` shows them")

    from accelkit.scaffold import init_project

    project = init_project(directory, template, backend=backend, num_processes=num_processes, force=force)
    where = shlex.quote(str(directory))
    click.echo(f"Created {directory}/ from template `{project.template.name}` with {project.config_path.name} "
               f"({project.backend}, {project.num_processes} process(es)).")
    for replaced, backup in project.replaced:
        click.echo(f"Replaced {replaced} (your version is kept as {backup.name}).")
    click.echo(f"\nNext (see {directory}/README.md):\n  cd {where}")
    for purpose, line in project.commands.items():
        click.echo(f"  {line:<90}  # {purpose}")
    return 0
