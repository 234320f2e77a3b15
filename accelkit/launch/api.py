"""`accelkit launch` as one library call: run the job under supervision, print it (--dry-run), or write it as a
cluster job (--slurm, --skypilot, --kubernetes) with its config beside it."""

from __future__ import annotations

import shlex
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.command_result import CommandResult
from accelkit.launch.build_plan import check_target, prepare_launch
from accelkit.launch.request import LaunchRequest

CLUSTER_FLAGS = ("--slurm", "--skypilot", "--kubernetes")


@dataclass(frozen=True)
class ClusterJobFile:
    """Write the launch as a job file for one scheduler instead of running it."""

    flag: str  # one of CLUSTER_FLAGS
    path: Path
    gpus_per_node: int = 0  # 0: not given (--num-processes then gives the total)
    job_name: str = "accelkit"
    force: bool = False
    partition: str | None = None  # --slurm
    time_limit: str | None = None  # --slurm
    requeue: bool = False  # --slurm
    signal_before: int = 120  # --slurm --requeue
    accelerator: str | None = None  # --skypilot
    image: str | None = None  # --kubernetes
    cpus_per_node: int | None = None  # every target: CPUs and memory per node
    mem_per_node: str | None = None  # a size, e.g. 512GiB
    setup: tuple[str, ...] = ()  # every target: shell lines run on every node before its launcher
    exclusive: bool = False  # --slurm
    account: str | None = None  # --slurm
    qos: str | None = None  # --slurm
    sbatch_args: tuple[str, ...] = ()  # --slurm
    container_image: str | None = None  # --slurm (pyxis)
    storage: tuple[str, ...] = ()  # --skypilot (buckets), --kubernetes (ReadWriteMany claims): MOUNT=SOURCE
    shm_size: str | None = None  # --kubernetes


def run_launch(request: LaunchRequest, *, stall_timeout: float | None = None, dry_run: bool = False,
               cluster: ClusterJobFile | None = None, ray: Mapping[str, Any] | None = None) -> CommandResult:
    """Launch `request` (the exit status is the first failing rank's), or only print it (`dry_run`), or write it for
    a cluster (`cluster`), or run it on a Ray cluster (`ray`: run_ray_launch's address, storage, cpus_per_worker).
    `stall_timeout`: the watchdog's (None: the default for the job's kind, 0: none)."""
    check_target(request.target)
    if ray is not None:
        from accelkit.launch.raytrain.driver import run_ray_launch

        return run_ray_launch(request, **ray, dry_run=dry_run)
    if cluster is not None:
        return write_cluster_job(request, cluster, stall_timeout)
    if dry_run:
        return CommandResult().out(dry_run_text_of(request))
    from accelkit.launch.supervised import run_request

    return CommandResult(exit_code=run_request(request, stall_timeout=stall_timeout))


def dry_run_text_of(request: LaunchRequest) -> str:
    """The job as --dry-run prints it. The printed command reads the config written here: its folder is kept on
    purpose, and named for what it is."""
    from accelkit.launch.summary import dry_run_text

    folder = Path(tempfile.mkdtemp(prefix="accelkit-dry-run-"))
    try:
        prepared = prepare_launch(request, config_path=folder / "accelerate_config.yaml", check_hardware=False)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return dry_run_text(prepared)


def write_cluster_job(request: LaunchRequest, job_file: ClusterJobFile, stall_timeout: float | None) -> CommandResult:
    """Write the job file of one cluster target; say what it resolved and how to submit it."""
    from accelkit.launch.cluster.targets import kubernetes, skypilot, slurm
    from accelkit.launch.cluster.targets.job_key import skypilot_launch_command
    from accelkit.launch.cluster.targets.node_resources import NodeResources, parse_memory
    from accelkit.launch.cluster.targets.storage import parse_storages

    nodes = 1 if request.options.num_machines is None else request.options.num_machines  # or its spelling --nodes
    path, name = job_file.path, job_file.job_name
    before = ""  # a step before the submission
    resources = NodeResources(cpus=job_file.cpus_per_node,
                              memory=parse_memory(job_file.mem_per_node, "--mem-per-node"))
    shape = {"nodes": nodes, "gpus_per_node": job_file.gpus_per_node, "job_name": name,
             "stall_timeout": stall_timeout, "resources": resources, "setup": tuple(job_file.setup)}
    if job_file.flag == "--slurm":
        job = slurm.write_slurm_job(request, slurm.SlurmOptions(
            **shape, partition=job_file.partition, time=job_file.time_limit, chdir=Path.cwd(),
            requeue=job_file.requeue, signal_before=job_file.signal_before, exclusive=job_file.exclusive,
            account=job_file.account, qos=job_file.qos, sbatch_args=tuple(job_file.sbatch_args),
            container_image=job_file.container_image), path, job_file.force)
        submit = f"sbatch {shlex.quote(str(path))}"
    elif job_file.flag == "--skypilot":
        job = skypilot.write_skypilot_task(request, skypilot.SkyPilotOptions(
            **shape, accelerator=job_file.accelerator, workdir=Path.cwd(),
            storage=parse_storages(tuple(job_file.storage), "SkyPilot")), path, job_file.force)
        submit = skypilot_launch_command(name, shlex.quote(str(path)))
    else:
        job = kubernetes.write_trainjob(request, kubernetes.KubernetesOptions(
            **shape, image=job_file.image, workdir=Path.cwd(),
            storage=parse_storages(tuple(job_file.storage), "Kubernetes"),
            shm_size=parse_memory(job_file.shm_size, "--shm-size")), path, job_file.force)
        submit = f"kubectl apply -f {shlex.quote(str(path))}"
        before = f"Create the job board's key once (a Secret): {kubernetes.create_secret_command(name)}\n"
    result = CommandResult()
    for line in job.summary:
        result.err(line)
    return result.out(f"Wrote {path} (config: {job.config_path}). {before}Submit it with: {submit}")
