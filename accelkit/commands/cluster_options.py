"""The resource, environment and storage options of `accelkit launch --slurm/--skypilot/--kubernetes`: what a node
is asked for (CPUs, memory, whole nodes, /dev/shm), where the job runs (account, QOS, more #SBATCH lines, set-up
lines, a container) and the storage its nodes share. Each option's targets are in launch.CLUSTER_ONLY; the values
are checked where the job is written (accelkit.launch.cluster.targets)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

# Option -> (parameter name, the job-file flags it applies with).
RESOURCE_OPTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "--cpus-per-node": ("cpus_per_node", ("--slurm", "--skypilot", "--kubernetes")),
    "--mem-per-node": ("mem_per_node", ("--slurm", "--skypilot", "--kubernetes")),
    "--setup": ("setup", ("--slurm", "--skypilot", "--kubernetes")),
    "--exclusive": ("exclusive", ("--slurm",)),
    "--account": ("account", ("--slurm",)),
    "--qos": ("qos", ("--slurm",)),
    "--sbatch-arg": ("sbatch_args", ("--slurm",)),
    "--container-image": ("container_image", ("--slurm",)),
    "--storage": ("storage", ("--skypilot", "--kubernetes")),
    "--shm-size": ("shm_size", ("--kubernetes",)),
}


def cluster_resource_options(func: Callable[..., Any]) -> Callable[..., Any]:
    options = [
        click.option("--cpus-per-node", type=click.IntRange(min=1), default=None, metavar="C",
                     help="With --slurm/--skypilot/--kubernetes: CPUs per node for all of its ranks and their data "
                          "loaders (SLURM: --cpus-per-task of the one launcher task per node). Default: SLURM whole "
                          "nodes (--exclusive) for GPU jobs; Kubernetes 8 per GPU rank; a CPU per process for --cpu "
                          "jobs."),
        click.option("--mem-per-node", default=None, metavar="SIZE",
                     help="With --slurm/--skypilot/--kubernetes: memory per node, e.g. 512GiB (SLURM: --mem). Default "
                          "with --kubernetes: 32GiB per GPU rank, 4GiB per --cpu process (a request, no limit)."),
        click.option("--setup", multiple=True, metavar="LINE",
                     help="With --slurm/--skypilot/--kubernetes: a shell line run on every node before its launcher "
                          "(modules, a venv); repeat for more lines."),
        click.option("--exclusive", is_flag=True, default=None,
                     help="With --slurm: whole nodes (all their CPUs and, without --mem-per-node, all memory)."),
        click.option("--account", default=None, metavar="A", help="With --slurm: the account the job is charged to."),
        click.option("--qos", default=None, metavar="Q", help="With --slurm: the quality of service."),
        click.option("--sbatch-arg", "sbatch_args", multiple=True, metavar="--OPT=VALUE",
                     help="With --slurm: one more #SBATCH line, e.g. --sbatch-arg=--constraint=a100; repeatable."),
        click.option("--container-image", default=None, metavar="IMAGE",
                     help="With --slurm: run every node's launcher and ranks in this image (pyxis/enroot: srun "
                          "--container-image), with the job's folder mounted."),
        click.option("--storage", multiple=True, metavar="MOUNT=SOURCE",
                     help="With --skypilot: mount a bucket (s3://, gs://, ...) at MOUNT on every node; with "
                          "--kubernetes: a ReadWriteMany PersistentVolumeClaim. Sharded checkpoints of multi-node "
                          "jobs must be written there."),
        click.option("--shm-size", default=None, metavar="SIZE",
                     help="With --kubernetes: the size limit of the pods' /dev/shm (a memory volume), e.g. 64GiB. "
                          "Default: half the pod's memory request."),
    ]
    for option in reversed(options):
        func = option(func)
    return func
