"""`accelkit convert`: rewrite a single-device PyTorch training script as an Accelerate script."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from accelkit.errors import AccelkitError

BACKUP_SUFFIX = ".bak"


@click.command(name="convert")
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the converted script (default: <name>_accelerate.py beside SCRIPT).")
@click.option("--in-place", is_flag=True, help=f"Rewrite SCRIPT itself, keeping the original as SCRIPT{BACKUP_SUFFIX}.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff and write nothing.")
@click.option("--mixed-precision", type=click.Choice(["no", "fp16", "bf16"]), default=None,
              help="Hard-code Accelerator(mixed_precision=...). Default: keep the script's AMP setting, or let the "
                   "launch config decide.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 when the script would be converted (for CI).")
@click.option("--force", is_flag=True, help="Overwrite an existing output (or backup) file.")
def command(script: Path, output: Path | None, in_place: bool, show_diff: bool, mixed_precision: str | None,
            check: bool, force: bool) -> int:
    """Convert SCRIPT (single GPU/CPU PyTorch training) into an Accelerate script and print what changed.

    \b
      accelkit convert train.py                  # writes train_accelerate.py
      accelkit convert train.py --diff           # show the changes only
      accelkit convert train.py --in-place       # rewrite, keep train.py.bak
      accelkit convert train.py --check          # exit 1 if there is something to convert
    """
    from accelkit.convert import ConvertOptions, convert_source

    if sum([output is not None, in_place, show_diff]) > 1:
        raise click.UsageError("use only one of -o/--output, --in-place and --diff")
    try:
        source = script.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise AccelkitError(f"{script} is not UTF-8 text", hint="convert a Python source file") from None
    result = convert_source(source, ConvertOptions(mixed_precision=mixed_precision), filename=script.name)
    report = result.report.format(script.name)

    if check:
        click.echo(report)
        return 1 if result.changed else 0
    if show_diff:
        click.echo("".join(difflib.unified_diff(source.splitlines(keepends=True), result.code.splitlines(keepends=True),
                                                fromfile=str(script), tofile=f"{script} (converted)")), nl=False)
        click.echo(report, err=True)
        return 0
    if not result.changed:
        click.echo(report)
        click.echo("Nothing written.")
        return 0
    if in_place:
        backup = script.with_name(script.name + BACKUP_SUFFIX)
        if backup.exists() and not force:
            raise AccelkitError(f"backup {backup} already exists", hint="move it away, or pass --force to replace it")
        _write(backup, source)
        _write(script, result.code)
        click.echo(report)
        click.echo(f"Rewrote {script} (original kept in {backup}).")
        return 0
    target = output if output is not None else script.with_name(f"{script.stem}_accelerate.py")
    if target.resolve() == script.resolve():
        raise AccelkitError("the output would overwrite the input script", hint="use --in-place (keeps a backup)")
    if target.exists() and not force:
        raise AccelkitError(f"{target} already exists", hint="pass --force to overwrite it, or choose -o OUT")
    _write(target, result.code)
    click.echo(report)
    click.echo(f"Wrote {target}. Try it: accelkit launch --cpu --num-processes 2 {target}")
    return 0



def _write(path: Path, text: str) -> None:
    from accelkit.fsio import atomic_write

    atomic_write(path, text)
