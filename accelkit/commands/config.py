"""`accelkit config`: write an Accelerate config that `accelerate launch --config_file` accepts unchanged."""

from __future__ import annotations

from pathlib import Path

import click

from accelkit import shellwords
from accelkit.commands.config_options import config_options, nonempty_path, options_from_kwargs
from accelkit.commands.vocabulary import AccelkitCommand


def command_line(options, output: Path | None) -> str:
    """The accelkit command that reproduces this config, for the YAML's header comment."""
    return shellwords.command_line("accelkit", "config", flags=[*options.flags(), ("-o", output)])


def _print_findings(findings) -> None:
    for finding in findings:
        click.echo(finding.lines(), err=True)


def _list_presets() -> int:
    from accelkit.configs import list_presets

    presets = list_presets()
    width = max((len(p.name) for p in presets), default=0)
    for p in presets:
        click.echo(f"{p.name.ljust(width)}  {p.description}")
    if presets:
        click.echo(f"\nUse one with `accelkit config --preset NAME [options] -o my.yaml`, or launch it as it is: "
                   f"`accelerate launch --config_file {presets[0].path.parent}/NAME.yaml ...`.", err=True)
    return 0


def _check(path: Path) -> int:
    from accelkit.configs import check_config

    findings = check_config(path)
    _print_findings(findings)
    errors = sum(f.is_error for f in findings)
    warnings = len(findings) - errors
    if errors:
        click.echo(f"{path}: {errors} error(s), {warnings} warning(s).", err=True)
        return 1
    click.echo(f"{path}: OK: Accelerate's loader accepts it" + (f"; {warnings} warning(s)." if warnings else "."))
    return 0


def _refuse_overwrite(paths: list[Path], force: bool) -> None:
    from accelkit.fsio import refuse_overwrite

    for path in paths:
        refuse_overwrite(path, force)


@click.command(name="config", cls=AccelkitCommand)
@config_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
              callback=nonempty_path, help="Write the YAML here (without it: print the YAML).")
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
    if list_ or check_path is not None:
        if list_ and check_path is not None:
            raise click.UsageError("use --list or --check, not both")
        if options.given() or output is not None:
            raise click.UsageError("--list and --check take no other options")
        return _list_presets() if list_ else _check(check_path)

    from accelkit.configs import render_yaml, resolve_config, write_config, write_deepspeed_json

    config = resolve_config(options)
    _print_findings(config.findings)
    line = command_line(options, output)
    json_path = config.json_path()
    targets = [output] if output is not None else []
    if json_path is not None:
        targets.append(json_path)
    _refuse_overwrite(targets, force)
    if output is None:
        if json_path is not None:
            click.echo(f"Wrote the DeepSpeed JSON to {write_deepspeed_json(config)}", err=True)
        click.echo(render_yaml(config, line), nl=False)
        return 0
    write_config(config, output, line)
    click.echo(f"Wrote {output}" + (f" and {json_path}" if json_path is not None else "") +
               f" ({config.distributed_type}, {config.num_processes} process(es)"
               f" on {config.num_machines} machine(s)).")
    click.echo(f"Launch: accelerate launch --config_file {output} your_script.py")
    return 0
