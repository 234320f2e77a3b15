"""`accelkit config`: write an Accelerate config that `accelerate launch --config_file` accepts unchanged."""

from __future__ import annotations

from pathlib import Path

import click

from accelkit.commands.config_options import config_options, nonempty_path, options_from_kwargs
from accelkit.commands.printing import finish
from accelkit.commands.vocabulary import AccelkitCommand


@click.command(name="config", cls=AccelkitCommand)
@config_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=nonempty_path, help="Write the YAML here (without it, or with `-o -`: print the YAML).")
@click.option("--force", is_flag=True, help="Overwrite existing output files.")
@click.option("--list", "list_", is_flag=True, help="List the presets in accelerate_configs/ and exit.")
@click.option("--check", "check_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", callback=nonempty_path,
              help="Check an existing config: Accelerate's loader plus accelkit's checks, each with its fix. Exits 1 "
                   "on errors.")
def command(output: Path | None, force: bool, list_: bool, check_path: Path | None, **kwargs) -> int:
    """Write an Accelerate config YAML for single, cpu, ddp, fsdp or deepspeed.

    \b
      accelkit config --backend fsdp --num-processes 8 -o fsdp.yaml
      accelkit config --preset deepspeed_zero3 --offload --deepspeed-json ds.json -o ds.yaml
      accelkit config --backend ddp --num-processes 16 --num-machines 2 --main-process-ip 10.0.0.1
      accelkit config --list
      accelkit config --check my_config.yaml
    """
    options = options_from_kwargs(kwargs)
    if output is not None and str(output) == "-":  # the Unix convention: `-o -` is standard output, not a file "-"
        output = None
    if list_ or check_path is not None:
        if list_ and check_path is not None:
            raise click.UsageError("use --list or --check, not both")
        if options.given() or output is not None:
            raise click.UsageError("--list and --check take no other options")
    from accelkit.configs import run_config

    return finish(run_config(options, output, force=force, listing=list_, check=check_path))
