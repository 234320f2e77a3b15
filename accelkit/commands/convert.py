"""`accelkit convert`: rewrite a single-device PyTorch training script as an Accelerate script, and prove it."""

from __future__ import annotations

import difflib
from pathlib import Path

import click

from accelkit.commands.script_args import ScriptCommand, script_args_argument
from accelkit.commands.supervision_options import Seconds
from accelkit.convert import BACKUP_SUFFIX  # light: loads convert/write.py only, no codemod
from accelkit.errors import AccelkitError
from accelkit.shellwords import command_line

CHECK_PROCESSES = 2


@click.command(name="convert", cls=ScriptCommand, context_settings={"ignore_unknown_options": True})
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Where to write the converted script (default: <name>_accelerate.py beside SCRIPT).")
@click.option("--in-place", is_flag=True, help=f"Rewrite SCRIPT itself, keeping the original as SCRIPT{BACKUP_SUFFIX}.")
@click.option("--diff", "show_diff", is_flag=True, help="Print a unified diff and write nothing.")
@click.option("--exit-code", is_flag=True,
              help="With --diff: exit 1 when the script would be converted, 0 when there is nothing to do (for CI).")
@click.option("--mixed-precision", type=click.Choice(["no", "fp16", "bf16"]), default=None,
              help="Hard-code Accelerator(mixed_precision=...). Default: keep the script's AMP setting, or let the "
                   "launch config decide.")
@click.option("--partial", is_flag=True,
              help="Write the conversion even when some of it could not be done (the report lists what is left).")
@click.option("--check", is_flag=True,
              help="Run the original on 1 process and the conversion on 2 CPU processes and check that they train "
                   "the same model (one PASS/FAIL line per invariant). Arguments after SCRIPT go to the script.")
@click.option("--converted", "converted_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              default=None, metavar="FILE",
              help="With --check: check FILE (a conversion you made or edited) instead of converting SCRIPT again.")
@click.option("--steps", type=click.IntRange(min=1), default=8, show_default=True, metavar="N",
              help="With --check: optimizer steps of the 2-process run (the original runs 2*N).")
@click.option("--stall-timeout", type=Seconds(minimum=1), default=60, show_default=True, metavar="SECONDS",
              help="With --check: when for this long no process of a run printed, read, wrote or stepped an optimizer "
                   "and one sat idle, the run hangs (the launch's stall watchdog): the check stops it and shows where "
                   "each process was.")
@click.option("--sandbox-limit", default="1GiB", show_default=True, metavar="SIZE",
              help="With --check: the most the check copies of the working directory into the sandbox each run "
                   "starts in (the scripts' writes land in the copy, never in your files), e.g. 8GiB.")
@click.option("--force", is_flag=True, help="Overwrite an existing output (or backup) file.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@script_args_argument()
def command(script: Path, script_args: tuple[str, ...], output: Path | None, in_place: bool, show_diff: bool,
            exit_code: bool, mixed_precision: str | None, partial: bool, check: bool,
            converted_file: Path | None, steps: int, stall_timeout: float, sandbox_limit: str, force: bool) -> int:
    """Convert SCRIPT (single GPU/CPU PyTorch training) into an Accelerate script and print what changed.

    \b
      accelkit convert train.py                  # writes train_accelerate.py
      accelkit convert train.py --diff           # show the changes only
      accelkit convert train.py --in-place       # rewrite, keep train.py.bak
      accelkit convert --check train.py --lr 0.1 # prove it: 1 process vs 2, invariant by invariant
      accelkit convert --check train.py -- --steps 5 # after --, everything goes to the script
      accelkit convert train.py --diff --exit-code   # CI: exit 1 if there is something to convert
    """
    if sum([output is not None, in_place, show_diff, check]) > 1:
        raise click.UsageError("use only one of -o/--output, --in-place, --diff and --check")
    if exit_code and not show_diff:
        raise click.UsageError("--exit-code goes with --diff")
    if script_args and not check:
        raise click.UsageError(f"unexpected argument {script_args[0]!r} (arguments after SCRIPT are passed to the "
                               "script by --check only)")
    if converted_file is not None and not check:
        raise click.UsageError("--converted goes with --check")
    if check:
        from accelkit.plan import parse_bytes

        limit = parse_bytes(sandbox_limit, "--sandbox-limit")
        return _check(script, list(script_args), steps, stall_timeout, converted_file, limit)

    from accelkit.convert import ConvertOptions, convert_source, read_script, write_conversion

    source = read_script(script)
    result = convert_source(source, ConvertOptions(mixed_precision=mixed_precision), filename=script.name)
    report = result.report.format(script.name)
    problems = result.report.problems

    if show_diff:
        click.echo("".join(difflib.unified_diff(source.splitlines(keepends=True), result.code.splitlines(keepends=True),
                                                fromfile=str(script), tofile=f"{script} (converted)")), nl=False)
        click.echo(report, err=True)
        return 1 if exit_code and result.changed else 0
    if result.report.status == "trainer":  # one line: how to launch it as it is
        click.echo(report)
        return 0
    if not result.changed:
        click.echo(report)
        click.echo("Nothing written.")
        return 0
    if problems and not partial:
        click.echo(report)
        raise AccelkitError(f"{script.name} cannot be converted completely: {problems[0].format()}"
                            + (f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""),
                            hint="fix these in the original and convert again, or pass --partial to write the "
                                 "conversion with them left to do; nothing was written")
    written = write_conversion(script, source, result.code, output=output, in_place=in_place, force=force)
    click.echo(report)
    if written.backup is not None:
        click.echo(f"Rewrote {script} (original kept in {written.backup}).")
    else:
        click.echo(f"Wrote {written.path}.{' Problems left: see NOT CONVERTED above.' if problems else ''}")
    click.echo(f"Try it: {try_it(written.path)}")
    return 0


def try_it(path: Path) -> str:
    """The command that runs a converted script on 2 CPU processes, exactly as it can be pasted."""
    return command_line("accelkit", "launch", flags=[("--cpu", True), ("--num-processes", CHECK_PROCESSES)],
                        args=[path])


def _check(script: Path, args: list[str], steps: int, stall_timeout: float, converted_file: Path | None,
           sandbox_limit: int) -> int:
    from accelkit.convert import CheckOptions, check_script, read_script

    what = converted_file.name if converted_file is not None else "the conversion"
    click.echo(f"accelkit convert --check {script.name}: the original on 1 process, {what} on "
               f"{CHECK_PROCESSES} CPU processes (DDP rehearsal), {steps} step(s), each in a copy of "
               "the working directory...", err=True)
    converted_code = read_script(converted_file) if converted_file is not None else None
    outcome = check_script(script, args, CheckOptions(steps=steps, processes=CHECK_PROCESSES,
                                                      stall_seconds=stall_timeout, sandbox_limit=sandbox_limit),
                           converted_code=converted_code,
                           converted_name=converted_file.name if converted_file is not None else None)
    if outcome.conversion_problems:
        click.echo("The conversion left problems (NOT CONVERTED in its report):")
        for problem in outcome.conversion_problems:
            click.echo(f"  {problem}")
    click.echo(outcome.format())
    outcome.raise_unless_passed(script, args, steps)
    skipped = "; ".join(f"{v.name} ({v.summary})" for v in outcome.not_checked)
    click.echo(f"Check passed: the converted {script.name} trains the same model on {CHECK_PROCESSES} processes "
               f"as the original on one. Checked: {', '.join(outcome.checked)}."
               + (f" Not checked: {skipped}." if skipped else ""))
    return 0
