"""`accelkit launch`: run a training script on every process of a job (or rehearse it on CPU, or write SLURM)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from accelkit.commands.cluster_options import RESOURCE_OPTIONS, cluster_resource_options
from accelkit.commands.config_options import config_options, nonempty_path, options_from_kwargs
from accelkit.commands.launcher_options import config_file_option, rendezvous_options, run_options
from accelkit.commands.printing import finish
from accelkit.commands.script_args import ScriptCommand, script_args_argument
from accelkit.commands.supervision_options import Seconds, stall_timeout_option
from accelkit.limits import MAX_MONITOR_INTERVAL, MAX_RAY_CPUS_PER_WORKER, MAX_RESTARTS
from accelkit.shellwords import command_line

if TYPE_CHECKING:
    from accelkit.launch import ClusterJobFile

# The job-file options (their parameter names): write one of them instead of launching.
CLUSTER_FILES = {"--slurm": "slurm_file", "--skypilot": "skypilot_file", "--kubernetes": "kubernetes_file"}


@click.command(name="launch", cls=ScriptCommand,
               context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@config_file_option
@config_options
@run_options
@click.option("--dry-run", is_flag=True, default=False,
              help="Print the exact command, its environment and the config; start nothing.")
@click.option("--max-restarts", type=click.IntRange(min=0, max=MAX_RESTARTS), default=None, metavar="N",
              help="Restart the whole worker group up to N times after a failure (torchrun). Default 0.")
@click.option("--monitor-interval", type=click.FloatRange(min=0, min_open=True, max=MAX_MONITOR_INTERVAL), default=None,
              metavar="SECONDS",
              help="How often torchrun checks its ranks. Default 0.1.")
@rendezvous_options
@click.option("--lost-timeout", type=Seconds(), default=None, metavar="SECONDS",
              help="Multi-machine jobs: when a machine's heartbeat is silent this long (its processes gone, or "
                   "unreachable), machine 0 names it and ends the job. Default 20; 0 turns it off.")
# The supervisor's stall watchdog (issue #15): the option and its value handed to run_request.
@stall_timeout_option()
@click.option("--preemption-grace", type=Seconds(), default=None, metavar="SECONDS",
              help="On SIGTERM (a preemption), the ranks that handle the templates' save request (SIGUSR1) save a "
                   "checkpoint and stop within this many seconds; exit 143. Default 120; 0: SIGTERM stops at once.")
@click.option("--rank-prefix", is_flag=True, default=False,
              help="Start every line a process prints with [rank N] (its global rank). Lines are whole either way.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Run on a Ray cluster: one Ray Train worker per process, restarted by Ray (--max-restarts). "
                   "ADDRESS: the head's HOST:PORT, or auto for the cluster this machine belongs to.")
@click.option("--ray-storage", type=click.Path(file_okay=False, path_type=Path), default=None, metavar="DIR",
              callback=nonempty_path, help="With --ray: Ray Train's run storage (RunConfig.storage_path), on storage "
                                           "every node shares. Default: Ray's own.")
@click.option("--ray-cpus-per-worker", type=click.IntRange(min=1, max=MAX_RAY_CPUS_PER_WORKER), default=None,
              metavar="N", help="With --ray: CPUs each worker asks Ray for. Default 1.")
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
                   "and stop, and the job requeues itself; a script that loads its latest checkpoint resumes from it.")
@click.option("--signal-before", type=click.IntRange(min=1), default=None, metavar="SECONDS",
              help="With --slurm --requeue: send SIGUSR1 this long before the time limit. Default 120.")
@click.option("--accelerator", default=None, metavar="NAME",
              help="With --skypilot: the GPU to ask for, e.g. H100 (`sky gpus list`); --gpus-per-node of them.")
@click.option("--image", default=None, metavar="IMAGE",
              help="With --kubernetes: the container image (accelkit, the job's packages, the project).")
@cluster_resource_options
@click.argument("script", metavar="SCRIPT")
@script_args_argument()
def command(config_file: Path | None, cpu: bool, module: bool, dry_run: bool, max_restarts: int | None,
            monitor_interval: float | None, rdzv_backend: str | None, rdzv_conf: str | None,
            same_network: bool | None, lost_timeout: float | None, stall_timeout: float | None,
            preemption_grace: float | None, rank_prefix: bool, ray_address: str | None, ray_storage: Path | None,
            ray_cpus_per_worker: int | None, script: str,
            script_args: tuple[str, ...],
            **kwargs: object) -> int:
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
      accelkit launch --backend fsdp --ray auto --num-processes 16 --max-restarts 2 train.py

    Without GPUs, GPU backends need --cpu (a CPU rehearsal); `--cpu --num-processes N` alone runs N data-parallel
    CPU processes. Exit status: the first failing rank's.
    """
    from accelkit.launch import LauncherFlags, LaunchRequest, LaunchTarget, run_launch

    options = options_from_kwargs(kwargs)
    cluster = cluster_job_file(kwargs)
    ray = ray_options(ray_address, ray_storage, ray_cpus_per_worker, cluster=cluster, options=options,
                      given={"--lost-timeout": lost_timeout, "--stall-timeout": stall_timeout,
                             "--preemption-grace": preemption_grace,
                             "--monitor-interval": monitor_interval, "--rdzv-backend": rdzv_backend,
                             "--rdzv-conf": rdzv_conf, "--same-network": same_network})
    if options.model_config is None and cluster is None:  # a local model folder the script is given is known
        from accelkit.configs import model_from_script_args

        options.model_config = model_from_script_args(script_args, script=None if module else script)
    request = LaunchRequest(target=LaunchTarget(script=script, args=tuple(script_args), module=module),
                            options=options, config_file=config_file, cpu=cpu,
                            flags=LauncherFlags(max_restarts=max_restarts, monitor_interval=monitor_interval,
                                                rdzv_backend=rdzv_backend, rdzv_conf=rdzv_conf,
                                                same_network=same_network),
                            command_line=command_line("accelkit", *sys.argv[1:]), lost_timeout=lost_timeout,
                            preemption_grace=preemption_grace, rank_prefix=rank_prefix)
    return finish(run_launch(request, stall_timeout=stall_timeout, dry_run=dry_run, cluster=cluster, ray=ray))


# Launch options that mean nothing under --ray: Ray places and watches the workers.
RAY_EXCLUDED = ("--lost-timeout", "--stall-timeout", "--preemption-grace", "--monitor-interval", "--rdzv-backend",
                "--rdzv-conf", "--same-network")
RAY_EXCLUDED_CONFIG = {"num_machines": "--num-machines", "machine_rank": "--machine-rank",
                       "main_process_ip": "--main-process-ip", "main_process_port": "--main-process-port"}


def ray_options(address: str | None, storage: Path | None, cpus_per_worker: int | None, *,
                cluster: ClusterJobFile | None, options, given: dict[str, object]) -> dict[str, object] | None:
    """The --ray target's settings for run_ray_launch (None: not a Ray launch), or a usage error for options that do
    not go with it."""
    if address is None:
        for flag, value in (("--ray-storage", storage), ("--ray-cpus-per-worker", cpus_per_worker)):
            if value is not None:
                raise click.UsageError(f"{flag} only applies with --ray ADDRESS")
        return None
    if not address.strip():
        raise click.UsageError("--ray needs the head's HOST:PORT, or auto")
    if cluster is not None:
        raise click.UsageError(f"--ray and {cluster.flag} cannot be combined: run on Ray, or write a job file")
    for flag in RAY_EXCLUDED:
        if given.get(flag) not in (None, False):
            raise click.UsageError(f"{flag} does not apply with --ray: Ray Train places, watches and restarts the "
                                   "workers (--max-restarts)")
    for name, flag in RAY_EXCLUDED_CONFIG.items():
        if getattr(options, name) is not None:
            raise click.UsageError(f"{flag} does not apply with --ray: Ray places the workers on its nodes; give "
                                   "--num-processes (the total)")
    return {"address": address.strip(), "storage": storage, "cpus_per_worker": cpus_per_worker}


# Each cluster-only option (its parameter name) -> the job-file flags it applies with.
CLUSTER_ONLY = {"--gpus-per-node": ("gpus_per_node", CLUSTER_FILES), "--job-name": ("job_name", CLUSTER_FILES),
                "--force": ("force", CLUSTER_FILES), "--partition": ("partition", ("--slurm",)),
                "--time": ("time_limit", ("--slurm",)), "--requeue": ("requeue", ("--slurm",)),
                "--signal-before": ("signal_before", ("--slurm",)), "--accelerator": ("accelerator", ("--skypilot",)),
                "--image": ("image", ("--kubernetes",)), **RESOURCE_OPTIONS}


def cluster_job_file(kwargs: dict[str, object]) -> ClusterJobFile | None:
    """Pop the cluster target's options out of `kwargs`: the job file to write (None: launch), or a usage error for
    options that do not go together."""
    from accelkit.launch import ClusterJobFile

    files = {flag: kwargs.pop(name) for flag, name in CLUSTER_FILES.items()}
    values = {flag: kwargs.pop(name) for flag, (name, _) in CLUSTER_ONLY.items()}
    chosen = [flag for flag, path in files.items() if path is not None]
    if len(chosen) > 1:
        raise click.UsageError(f"{' and '.join(chosen)} cannot be combined: write one job file at a time")
    for flag, (_, allowed) in CLUSTER_ONLY.items():
        if values[flag] not in (None, ()) and not set(chosen) & set(allowed):
            raise click.UsageError(f"{flag} only applies with {'/'.join(f'{a} FILE' for a in allowed)}")
    if values["--signal-before"] is not None and not values["--requeue"]:
        raise click.UsageError("--signal-before only applies with --requeue")
    if not chosen:
        return None
    given = {CLUSTER_ONLY[flag][0]: value for flag, value in values.items() if value}  # not given: the defaults
    return ClusterJobFile(flag=chosen[0], path=files[chosen[0]], **given)
