"""`accelkit launch`: run a training script on every process of a job (or rehearse it on CPU, or write SLURM)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import click

from accelkit.commands.config_options import config_options, nonempty_path, options_from_kwargs
from accelkit.commands.launcher_options import config_file_option, rendezvous_options, run_options
from accelkit.commands.script_args import ScriptCommand, script_args_argument
from accelkit.commands.supervision_options import stall_timeout_option


@click.command(name="launch", cls=ScriptCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_file_option
@config_options
@run_options
@click.option("--dry-run", is_flag=True, default=False,
              help="Print the exact command, its environment and the config; start nothing.")
@click.option("--max-restarts", type=click.IntRange(min=0), default=None, metavar="N",
              help="Restart the whole worker group up to N times after a failure (torchrun). Default 0.")
@click.option("--monitor-interval", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="How often torchrun checks its ranks. Default 0.1.")
@rendezvous_options
# The supervisor's stall watchdog (issue #15): the option and its value handed to run_request.
@stall_timeout_option()
@click.option("--slurm", "slurm_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", callback=nonempty_path,
              help="Write an sbatch script (and its config beside it) instead of launching.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, metavar="G",
              help="With --slurm: GPUs per node (with --cpu: processes per node).")
@click.option("--partition", default=None, metavar="P", help="With --slurm: partition.")
@click.option("--time", "time_limit", default=None, metavar="T", help="With --slurm: time limit, e.g. 04:00:00.")
@click.option("--job-name", default=None, metavar="J", help="With --slurm: job name. Default: accelkit.")
@click.option("--requeue", is_flag=True, default=None,
              help="With --slurm: on SIGUSR1 (before the time limit or a preemption) the ranks save a checkpoint "
                   "and stop, and the job requeues itself; the script resumes from its latest checkpoint.")
@click.option("--signal-before", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="With --slurm --requeue: send SIGUSR1 this long before the time limit. Default 120.")
@click.argument("script", metavar="SCRIPT")
@script_args_argument()
def command(config_file: Path | None, cpu: bool, module: bool, dry_run: bool, max_restarts: int | None,
            monitor_interval: float | None, rdzv_backend: str | None, rdzv_conf: str | None,
            same_network: bool | None, slurm_file: Path | None, gpus_per_node: int | None,
            partition: str | None, time_limit: str | None, job_name: str | None, requeue: bool | None,
            signal_before: int | None, script: str,
            script_args: tuple[str, ...], **kwargs: object) -> int:
    """Launch SCRIPT on every process of the job; everything after SCRIPT goes to the script.

    \b
      accelkit launch --backend fsdp --num-processes 8 train.py --lr 3e-4
      accelkit launch --config fsdp.yaml --mixed-precision bf16 train.py -- --max-steps 1000
      accelkit launch --cpu --num-processes 2 train.py
      accelkit launch --cpu --backend deepspeed --zero-stage 3 --num-processes 2 train.py
      accelkit launch --backend ddp --dry-run train.py
      accelkit launch --backend fsdp --slurm job.sbatch --num-machines 2 --gpus-per-node 8 train.py

    Without GPUs, GPU backends need --cpu (a CPU rehearsal); `--cpu --num-processes N` alone runs N data-parallel
    CPU processes. Exit status: the first failing rank's.
    """
    from accelkit.launch import LauncherFlags, LaunchRequest, LaunchTarget, check_target

    stall_timeout = kwargs.pop("stall_timeout")  # for the supervisor (run_request), not a config option
    options = options_from_kwargs(kwargs)
    slurm_only = {"--gpus-per-node": gpus_per_node, "--partition": partition,
                  "--time": time_limit, "--job-name": job_name, "--requeue": requeue,
                  "--signal-before": signal_before}
    if slurm_file is None and any(v is not None for v in slurm_only.values()):
        flag = next(k for k, v in slurm_only.items() if v is not None)
        raise click.UsageError(f"{flag} only applies with --slurm FILE")
    if signal_before is not None and not requeue:
        raise click.UsageError("--signal-before only applies with --requeue")

    target = LaunchTarget(script=script, args=tuple(script_args), module=module)
    check_target(target)
    flags = LauncherFlags(max_restarts=max_restarts, monitor_interval=monitor_interval, rdzv_backend=rdzv_backend,
                          rdzv_conf=rdzv_conf, same_network=same_network)
    request = LaunchRequest(target=target, options=options, config_file=config_file, cpu=cpu, flags=flags,
                            command_line=shlex.join(["accelkit", *sys.argv[1:]]))

    if slurm_file is not None:
        from accelkit.launch import SlurmOptions, write_slurm_job

        nodes = 1 if options.num_machines is None else options.num_machines
        slurm = SlurmOptions(nodes=nodes, gpus_per_node=gpus_per_node or 0,
                             partition=partition, time=time_limit, job_name=job_name or "accelkit",
                             chdir=Path.cwd(), stall_timeout=stall_timeout, requeue=bool(requeue),
                             signal_before=signal_before or 120)
        config_path, lines = write_slurm_job(request, slurm, slurm_file)
        for line in lines:
            click.echo(line, err=True)
        click.echo(f"Wrote {slurm_file} (config: {config_path}). Submit it with: sbatch {shlex.quote(str(slurm_file))}")
        return 0
    if dry_run:
        import shutil
        import tempfile

        from accelkit.launch import dry_run_text, prepare_launch

        # The printed command reads this config: the folder is kept on purpose, and named for what it is.
        folder = Path(tempfile.mkdtemp(prefix="accelkit-dry-run-"))
        try:
            prepared = prepare_launch(request, config_path=folder / "accelerate_config.yaml", check_hardware=False)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        click.echo(dry_run_text(prepared))
        return 0

    from accelkit.launch import run_request

    return run_request(request, stall_timeout=stall_timeout)

