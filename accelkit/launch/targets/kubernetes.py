"""Write a Kubeflow Trainer TrainJob that runs one supervised accelkit launcher per node (`kubectl apply -f`).

The Trainer (trainer.kubeflow.org/v1alpha1) starts `numNodes` pods from the `torch-distributed` runtime, each with
`resourcesPerNode`, and sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT
in the trainer container (torchrun's own variables). The container's command is the per-node command
(node_command.py) reading them: machine 0 (PET_NODE_RANK 0, at PET_MASTER_ADDR) hosts the job board on the port
after PET_MASTER_PORT, and each pod checks the runtime's counts against the job it was written for. The image
holds accelkit, the packages and the project (the command runs in the image's working directory).
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.request import LaunchRequest
from accelkit.launch.targets.cluster_job import ClusterJob, ClusterTarget, JobOptions, write_cluster_job, yaml_document
from accelkit.launch.targets.node_command import NodeCommand

KUBERNETES = ClusterTarget(flag="--kubernetes", scheduler="Kubernetes", job_file="the TrainJob",
                           rank_source="PET_NODE_RANK")
API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "torch-distributed"
GPU_RESOURCE = "nvidia.com/gpu"
REQUEST_ENV = "ACCELKIT_LAUNCH_REQUEST"
# A TrainJob's name is a DNS-1123 label (the Trainer names the pods and the headless service after it).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


@dataclass(frozen=True, kw_only=True)
class KubernetesOptions(JobOptions):
    """What only Kubernetes is asked for (the job's shape and the request are the ClusterJob's)."""

    image: str | None  # None: refused (the runtime's default image has no accelkit)
    workdir: Path = Path(".")  # the project: the image holds it as its working directory


def container_command(options: KubernetesOptions) -> str:
    node = NodeCommand(machine_rank='"$PET_NODE_RANK"', main_process_ip='"$PET_MASTER_ADDR"',
                       main_process_port='"$PET_MASTER_PORT"', job_board_port='"$((PET_MASTER_PORT + 1))"',
                       expect_machines='"$PET_NNODES"', expect_processes_per_node='"$PET_NPROC_PER_NODE"',
                       stall_timeout=options.stall_timeout, node_name='"$(hostname)"')
    return "set -euo pipefail\n" + node.render() + "\n"


def render_trainjob(job: ClusterJob, options: KubernetesOptions, key: str | None = None) -> str:
    """The TrainJob YAML for `job`. `key`: the job board's key (random when not given)."""
    if job.gpus_per_node:
        resources = {"limits": {GPU_RESOURCE: str(job.gpus_per_node)}}
    else:  # a CPU job: a core per process
        resources = {"requests": {"cpu": str(job.processes_per_node)}}
    trainjob = {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": options.job_name},
        "spec": {
            "runtimeRef": {"name": RUNTIME},
            "trainer": {
                "image": options.image,
                "numNodes": job.nodes,
                "numProcPerNode": job.processes_per_node,
                "resourcesPerNode": resources,
                "command": ["bash", "-c", container_command(options)],
                "env": [{"name": REQUEST_ENV, "value": job.request.to_json()},
                        {"name": "ACCELKIT_JOB_KEY", "value": key or secrets.token_hex(16)}],
            },
        },
    }
    header = [f"# Written by: {job.request.command_line}",
              "# Submit with: kubectl apply -f <this file>   (Kubeflow Trainer and its torch-distributed runtime)",
              f"# The image {options.image} must hold accelkit, the job's packages and the project as its working "
              "directory."]
    return yaml_document(header, trainjob)


def write_trainjob(request: LaunchRequest, options: KubernetesOptions, path: Path, force: bool = False) -> ClusterJob:
    """Write the TrainJob for `request` and its config beside it; return the job (its summary for the user)."""
    if not _NAME.match(options.job_name):
        raise AccelkitError(f"--job-name {options.job_name!r} is not a Kubernetes name",
                            hint="use at most 63 lowercase letters, digits and '-', starting and ending with a "
                                 "letter or digit")
    if not options.image:
        raise AccelkitError("--kubernetes needs the container image every pod runs",
                            hint="pass --image IMAGE: an image with accelkit, the job's packages and the project")
    if request.options.main_process_port is not None:
        raise AccelkitError("--main-process-port comes from the Trainer's runtime in the TrainJob (PET_MASTER_PORT)",
                            hint="drop --main-process-port; the torch-distributed runtime sets the port")
    return write_cluster_job(request, KUBERNETES, options, path, force, lambda job: render_trainjob(job, options),
                             workdir=options.workdir)
