"""`accelkit convert`: rewrite a single-device PyTorch training script as an Accelerate script, and prove it."""

from __future__ import annotations

from pathlib import Path

import click

from accelkit.commands.printing import finish, progress
from accelkit.commands.script_args import ScriptCommand, script_args_argument
from accelkit.commands.supervision_options import Seconds

# Kept literal (this module imports only click at load); tests/unit/convert/test_write.py checks it matches.
BACKUP_SUFFIX = ".bak"


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
@click.option("--backend", "check_backend", type=click.Choice(["ddp", "fsdp"]), default=None,
              help="With --check: the backend the 2-process run rehearses on CPU: ddp (default) or fsdp (fully_shard, "
                   "FSDP2: the weights are compared as the full tensors gathered from the shards).")
@click.option("--grad-compression", type=click.Choice(["none", "fp16", "bf16", "powersgd"]), default=None,
              help="Write Accelerator(kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=...)]): a DDP "
                   "gradient-compression hook (docs/guides/gradient-compression.md).")
@click.option("--powersgd-rank", type=int, default=None, metavar="R", help="With --grad-compression powersgd.")
@click.option("--powersgd-start-step", type=int, default=None, metavar="S", help="With --grad-compression powersgd.")
@click.option("--force", is_flag=True, help="Overwrite an existing output (or backup) file.")
@click.argument("script", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@script_args_argument()
def command(script: Path, script_args: tuple[str, ...], output: Path | None, in_place: bool, show_diff: bool,
            exit_code: bool, mixed_precision: str | None, partial: bool, check: bool,
            converted_file: Path | None, steps: int, stall_timeout: float, sandbox_limit: str,
            check_backend: str | None, force: bool, grad_compression: str | None = None,
            powersgd_rank: int | None = None, powersgd_start_step: int | None = None) -> int:
    """Convert SCRIPT (single GPU/CPU PyTorch training) into an Accelerate script and print what changed.

    \b
      accelkit convert train.py                  # writes train_accelerate.py
      accelkit convert train.py --diff           # show the changes only
      accelkit convert train.py --in-place       # rewrite, keep train.py.bak
      accelkit convert --check train.py --lr 0.1 # prove it: 1 process vs 2, invariant by invariant
      accelkit convert --check train.py -- --steps 5 # after --, everything goes to the script
      accelkit convert --check --backend fsdp train.py  # the 2-process run under FSDP
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
    if check_backend is not None and not check:
        raise click.UsageError("--backend goes with --check (the conversion itself runs under any backend)")
    from accelkit.compression.compression_spec import from_options
    from accelkit.convert import ConvertRequest, run_convert

    compression = from_options(grad_compression, powersgd_rank, powersgd_start_step).env_value()

    request = ConvertRequest(script=script, output=output, in_place=in_place, diff=show_diff, exit_code=exit_code,
                             mixed_precision=mixed_precision, grad_compression=compression, partial=partial,
                             force=force, check=check,
                             script_args=tuple(script_args), converted=converted_file, steps=steps,
                             stall_timeout=stall_timeout, sandbox_limit=sandbox_limit, backend=check_backend or "ddp")
    return finish(run_convert(request, progress=progress))
