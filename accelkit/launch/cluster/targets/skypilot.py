"""Write a SkyPilot task that runs one supervised accelkit launcher per node (`sky launch task.yaml`).

SkyPilot provisions `num_nodes` machines with `resources.accelerators` (e.g. H100:8) on whichever cloud or
Kubernetes cluster has them, copies `workdir` (the folder accelkit was run in) to every node, runs `setup` once per
node and then `run` on every node at once, with SKYPILOT_NODE_RANK, SKYPILOT_NODE_IPS (one per line, the head node
first), SKYPILOT_NUM_NODES and SKYPILOT_NUM_GPUS_PER_NODE set. The `run` block is the per-node command
(node_command.py): machine 0 is the first address of SKYPILOT_NODE_IPS and hosts the job board, and each node
checks SkyPilot's counts against the job it was written for. The job board's key is the task's one secret, with no
value in the file: `sky launch --secret` gives it (job_key.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.job_board import KEY_ENV
from accelkit.launch.cluster.targets.accelerators import canonical_accelerator
from accelkit.launch.cluster.targets.cluster_job import (
    ClusterJob,
    ClusterTarget,
    JobOptions,
    write_cluster_job,
    yaml_document,
)
from accelkit.launch.cluster.targets.job_key import skypilot_launch_command
from accelkit.launch.cluster.targets.node_command import NodeCommand
from accelkit.launch.cluster.targets.storage import SharedMount, check_checkpoints_shared
from accelkit.launch.request import LaunchRequest

SKYPILOT = ClusterTarget(flag="--skypilot", scheduler="SkyPilot", job_file="the task", rank_source="SKYPILOT_NODE_RANK")
DEFAULT_PORT = 29500  # SkyPilot's nodes are the job's own machines: a fixed port does not collide there
REQUEST_ENV = "ACCELKIT_LAUNCH_REQUEST"
# What the nodes install (pinned to this machine's versions, the ones the cross-node preflight compares).
SETUP_PACKAGES = ("accelkit", "torch", "accelerate", "transformers")
ACCELKIT_MOUNT = "~/.accelkit/src"  # where accelkit's own source tree goes on every node, when it runs from one


@dataclass(frozen=True, kw_only=True)
class SkyPilotOptions(JobOptions):
    """What only SkyPilot is asked for (the job's shape and the request are the ClusterJob's)."""

    accelerator: str | None = None  # e.g. H100 (None for --cpu)
    workdir: Path = Path(".")  # copied to every node; the run starts there
    storage: tuple[SharedMount, ...] = ()  # buckets mounted on every node (sharded checkpoints go there)


def _installed(package: str) -> str | None:
    try:
        version = metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
    return version.split("+")[0]  # a local build tag (2.13.0+cpu) is not on the package index


def accelkit_source() -> Path | None:
    """The source tree this accelkit runs from (a checkout, installed editable), or None for an installed wheel."""
    import accelkit

    root = Path(accelkit.__file__).resolve().parent.parent
    pyproject = root / "pyproject.toml"
    if pyproject.is_file() and 'name = "accelkit"' in pyproject.read_text(errors="replace"):
        return root
    return None


def setup_command(job: ClusterJob, source_mount: str | None) -> str:
    """`pip install` of what every node needs, at this machine's versions (the preflight compares them): the
    packages from the index, accelkit from its uploaded source tree when it runs from one."""
    packages = [name for name in SETUP_PACKAGES if not (name == "accelkit" and source_mount)]
    packages += ["deepspeed"] if job.backend == "deepspeed" else []
    pins = [f"{name}=={version}" for name in packages if (version := _installed(name))]
    command = "pip install " + " ".join(f'"{pin}"' for pin in pins)
    if source_mount:
        command += f" && pip install {source_mount}"
    return command


def run_command(job: ClusterJob, options: SkyPilotOptions) -> str:
    port = job.port or DEFAULT_PORT
    node = NodeCommand(machine_rank='"$SKYPILOT_NODE_RANK"', main_process_ip='"$MAIN_PROCESS_IP"',
                       main_process_port=str(port), job_board_port=str(port + 1),
                       expect_machines='"$SKYPILOT_NUM_NODES"',
                       expect_processes_per_node='"$SKYPILOT_NUM_GPUS_PER_NODE"',
                       stall_timeout=options.stall_timeout, node_name='"$(hostname)"')
    return "\n".join([
        "set -euo pipefail",
        *options.setup,
        "# Machine 0 is the head node: the first line of SKYPILOT_NODE_IPS (export MAIN_PROCESS_IP to override).",
        'MAIN_PROCESS_IP="${MAIN_PROCESS_IP:-$(echo "$SKYPILOT_NODE_IPS" | head -n1)}"',
        node.render(),
        "",
    ])


def render_task(job: ClusterJob, options: SkyPilotOptions) -> str:
    """The task YAML for `job`. The job board's key is a secret with no value in the file: `sky launch --secret`
    gives it (job_key.skypilot_launch_command), and SkyPilot redacts it from its logs and dashboard."""
    resources: dict = {}
    if job.gpus_per_node:
        resources["accelerators"] = f"{options.accelerator}:{job.gpus_per_node}"
    cpus = options.resources.cpus or (None if job.gpus_per_node else job.processes_per_node)  # --cpu: a core each
    if cpus is not None:
        resources["cpus"] = f"{cpus}+"
    if options.resources.memory is not None:  # SkyPilot's memory is in GB (GiB, as the clouds' catalogs list it)
        resources["memory"] = f"{-(-options.resources.memory // 2**30)}+"
    source = accelkit_source()
    file_mounts: dict = {}
    if source is not None:
        file_mounts[ACCELKIT_MOUNT] = str(source)
    for storage in options.storage:  # the same bucket on every node, read and written in place
        file_mounts[str(storage.mount)] = {"source": storage.source, "mode": "MOUNT"}
    task = {
        "name": options.job_name,
        "workdir": str(options.workdir),
        "num_nodes": job.nodes,
        "resources": resources,
        **({"file_mounts": file_mounts} if file_mounts else {}),
        "envs": {REQUEST_ENV: job.request.to_json()},  # what every node runs (accelkit launch's request)
        "secrets": {KEY_ENV: None},  # the key of the job board machine 0 hosts: given by `sky launch --secret`
        "setup": "\n".join([*options.setup, setup_command(job, ACCELKIT_MOUNT if source is not None else None)]) + "\n",
        "run": run_command(job, options),
    }
    header = [f"# Written by: {job.request.command_line}",
              f"# Launch with: {skypilot_launch_command('accelkit', '<this file>')}",
              "#   (the job board's key, made at launch; the exit status is the first failing rank's)",
              "# setup installs this machine's versions of the packages; every node must run the same ones."]
    header += [f"# Shared storage ({storage.source}) at {storage.mount} on every node: write checkpoints there."
               for storage in options.storage]
    return yaml_document(header, task)


_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._-]*$")


def write_skypilot_task(request: LaunchRequest, options: SkyPilotOptions, path: Path,
                        force: bool = False) -> ClusterJob:
    """Write the task for `request` and its config beside it; return the job (its summary for the user)."""
    if not _NAME.match(options.job_name):
        raise AccelkitError(f"--job-name {options.job_name!r} is not a SkyPilot task name",
                            hint="use letters, digits, '.', '_' and '-', starting with a letter or digit")
    if request.cpu:
        if options.accelerator is not None:
            raise AccelkitError("--accelerator asks SkyPilot for GPUs, but --cpu runs on CPU processes",
                                hint="drop --accelerator for a CPU job, or drop --cpu")
    elif options.accelerator is None:
        raise AccelkitError("--skypilot needs the accelerator to ask for",
                            hint="pass --accelerator NAME, e.g. H100 (`sky gpus list` shows what your clouds offer)")
    else:
        options = _with_accelerator(options, canonical_accelerator(options.accelerator))

    def check(job: ClusterJob) -> None:
        check_checkpoints_shared(sharded=job.sharded_checkpoints, nodes=job.nodes, backend=job.backend,
                                 mounts=options.storage, request=job.request, workdir=options.workdir,
                                 flag=SKYPILOT.flag)

    return write_cluster_job(request, SKYPILOT, options, path, force, lambda job: render_task(job, options),
                             workdir=options.workdir, check=check)


def _with_accelerator(options: SkyPilotOptions, name: str) -> SkyPilotOptions:
    from dataclasses import replace

    return replace(options, accelerator=name)
