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
@click.option("--skypilot", "skypilot_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", callback=nonempty_path,
              help="Write a SkyPilot task (and its config beside it) instead of launching.")
@click.option("--kubernetes", "kubernetes_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              metavar="FILE", callback=nonempty_path,
              help="Write a Kubeflow Trainer TrainJob (and its config beside it) instead of launching.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=None, metavar="G",
              help="With --slurm/--skypilot/--kubernetes: GPUs per node (with --cpu: processes per node).")
@click.option("--job-name", default=None, metavar="J",
              help="With --slurm/--skypilot/--kubernetes: the job's name. Default: accelkit.")
@click.option("--force", is_flag=True, default=None,
              help="With --slurm/--skypilot/--kubernetes: replace an existing job file (and its config).")
@click.option("--partition", default=None, metavar="P", help="With --slurm: partition.")
@click.option("--time", "time_limit", default=None, metavar="T", help="With --slurm: time limit, e.g. 04:00:00.")
@click.option("--requeue", is_flag=True, default=None,
              help="With --slurm: on SIGUSR1 (before the time limit or a preemption) the ranks save a checkpoint "
                   "and stop, and the job requeues itself; the script resumes from its latest checkpoint.")
@click.option("--signal-before", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="With --slurm --requeue: send SIGUSR1 this long before the time limit. Default 120.")
@click.option("--accelerator", default=None, metavar="NAME",
              help="With --skypilot: the GPU to ask for, e.g. H100 (`sky gpus list`); --gpus-per-node of them.")
@click.option("--image", default=None, metavar="IMAGE",
              help="With --kubernetes: the container image (accelkit, the job's packages, the project).")
@click.argument("script", metavar="SCRIPT")
@script_args_argument()
def command(config_file: Path | None, cpu: bool, module: bool, dry_run: bool, max_restarts: int | None,
            monitor_interval: float | None, rdzv_backend: str | None, rdzv_conf: str | None,
            same_network: bool | None, slurm_file: Path | None, skypilot_file: Path | None,
            kubernetes_file: Path | None, gpus_per_node: int | None, job_name: str | None,
            force: bool | None, partition: str | None, time_limit: str | None, requeue: bool | None,
            signal_before: int | None, accelerator: str | None, image: str | None, script: str,
            script_args: tuple[str, ...], **kwargs: object) -> int:
    """Launch SCRIPT on every process of the job; everything after SCRIPT goes to the script.

    \b
      accelkit launch --backend fsdp --num-processes 8 train.py --lr 3e-4
      accelkit launch --config fsdp.yaml --mixed-precision bf16 train.py -- --max-steps 1000
      accelkit launch --cpu --num-processes 2 train.py
      accelkit launch --cpu --backend deepspeed --zero-stage 3 --num-processes 2 train.py
      accelkit launch --backend ddp --dry-run train.py
      accelkit launch --backend fsdp --slurm job.sbatch --num-machines 2 --gpus-per-node 8 train.py
      accelkit launch --backend fsdp --skypilot task.yaml --num-machines 2 --gpus-per-node 8 --accelerator H100 train.py
      accelkit launch --backend fsdp --kubernetes trainjob.yaml --num-machines 2 --gpus-per-node 8 --image IMG train.py

    Without GPUs, GPU backends need --cpu (a CPU rehearsal); `--cpu --num-processes N` alone runs N data-parallel
    CPU processes. Exit status: the first failing rank's.
    """
    from accelkit.launch import LauncherFlags, LaunchRequest, LaunchTarget, check_target

    stall_timeout = kwargs.pop("stall_timeout")  # for the supervisor (run_request), not a config option
    options = options_from_kwargs(kwargs)
    targets = {"--slurm": slurm_file, "--skypilot": skypilot_file, "--kubernetes": kubernetes_file}
    chosen = [flag for flag, path in targets.items() if path is not None]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} cannot be combined: write one job file at a time")
    only = {"--gpus-per-node": (gpus_per_node, targets),
            "--job-name": (job_name, targets), "--force": (force, targets),
            "--partition": (partition, ["--slurm"]), "--time": (time_limit, ["--slurm"]),
            "--requeue": (requeue, ["--slurm"]), "--signal-before": (signal_before, ["--slurm"]),
            "--accelerator": (accelerator, ["--skypilot"]), "--image": (image, ["--kubernetes"])}
    for flag, (value, allowed) in only.items():
        if value is not None and not set(chosen) & set(allowed):
            raise click.UsageError(f"{flag} only applies with {'/'.join(f'{a} FILE' for a in allowed)}")
    if signal_before is not None and not requeue:
        raise click.UsageError("--signal-before only applies with --requeue")

    target = LaunchTarget(script=script, args=tuple(script_args), module=module)
    check_target(target)
    flags = LauncherFlags(max_restarts=max_restarts, monitor_interval=monitor_interval, rdzv_backend=rdzv_backend,
                          rdzv_conf=rdzv_conf, same_network=same_network)
    request = LaunchRequest(target=target, options=options, config_file=config_file, cpu=cpu, flags=flags,
                            command_line=shlex.join(["accelkit", *sys.argv[1:]]))

    if chosen:
        nodes = 1 if options.num_machines is None else options.num_machines  # --nodes is its other spelling
        return _write_cluster_job(request, chosen[0], targets[chosen[0]], nodes=nodes,
                                  gpus_per_node=gpus_per_node or 0, job_name=job_name or "accelkit",
                                  force=bool(force), stall_timeout=stall_timeout, partition=partition,
                                  time_limit=time_limit, requeue=bool(requeue), signal_before=signal_before or 120,
                                  accelerator=accelerator, image=image)
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



def _write_cluster_job(request, flag: str, path: Path, *, nodes: int, gpus_per_node: int, job_name: str, force: bool,
                       stall_timeout: float | None, partition: str | None, time_limit: str | None, requeue: bool,
                       signal_before: int, accelerator: str | None, image: str | None) -> int:
    """Write the job file of one cluster target; print what it resolved and how to submit it."""
    from accelkit import launch

    if flag == "--slurm":
        job = launch.write_slurm_job(request, launch.SlurmOptions(
            nodes=nodes, gpus_per_node=gpus_per_node, partition=partition, time=time_limit, job_name=job_name,
            chdir=Path.cwd(), stall_timeout=stall_timeout, requeue=requeue, signal_before=signal_before), path, force)
        submit = f"sbatch {shlex.quote(str(path))}"
    elif flag == "--skypilot":
        job = launch.write_skypilot_task(request, launch.SkyPilotOptions(
            nodes=nodes, gpus_per_node=gpus_per_node, accelerator=accelerator, job_name=job_name,
            workdir=Path.cwd(), stall_timeout=stall_timeout), path, force)
        submit = f"sky launch -c {shlex.quote(job_name)} {shlex.quote(str(path))}"
    else:
        job = launch.write_trainjob(request, launch.KubernetesOptions(
            nodes=nodes, gpus_per_node=gpus_per_node, image=image, job_name=job_name, workdir=Path.cwd(),
            stall_timeout=stall_timeout), path, force)
        submit = f"kubectl apply -f {shlex.quote(str(path))}"
    for line in job.summary:
        click.echo(line, err=True)
    click.echo(f"Wrote {path} (config: {job.config_path}). Submit it with: {submit}")
    return 0
