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
from accelkit.launch.cluster.targets.cluster_job import (
    ClusterJob,
    ClusterTarget,
    JobOptions,
    write_cluster_job,
    yaml_document,
)
from accelkit.launch.cluster.targets.node_command import NodeCommand
from accelkit.launch.cluster.targets.node_resources import kubernetes_quantity
from accelkit.launch.cluster.targets.storage import SharedMount, check_checkpoints_shared
from accelkit.launch.request import LaunchRequest

KUBERNETES = ClusterTarget(flag="--kubernetes", scheduler="Kubernetes", job_file="the TrainJob",
                           rank_source="PET_NODE_RANK")
API_VERSION = "trainer.kubeflow.org/v1alpha1"
RUNTIME = "torch-distributed"
GPU_RESOURCE = "nvidia.com/gpu"
REQUEST_ENV = "ACCELKIT_LAUNCH_REQUEST"
# A TrainJob's name is a DNS-1123 label (the Trainer names the pods and the headless service after it).
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
# The torch-distributed runtime's replicated job and its trainer container, both named "node": runtimePatches name
# them to add the pods' volumes (the TrainJob API has no other place for them).
RUNTIME_JOB = "node"
RUNTIME_CONTAINER = "node"
PATCH_MANAGER = "accelkit"
SHM_VOLUME = "dshm"


@dataclass(frozen=True, kw_only=True)
class KubernetesOptions(JobOptions):
    """What only Kubernetes is asked for (the job's shape and the request are the ClusterJob's)."""

    image: str | None  # None: refused (the runtime's default image has no accelkit)
    workdir: Path = Path(".")  # the project: the image holds it as its working directory
    storage: tuple[SharedMount, ...] = ()  # ReadWriteMany claims mounted in every pod (sharded checkpoints go there)
    shm_size: int | None = None  # bytes: the /dev/shm memory volume's size limit (None: the pod's memory)


def container_command(options: KubernetesOptions) -> str:
    node = NodeCommand(machine_rank='"$PET_NODE_RANK"', main_process_ip='"$PET_MASTER_ADDR"',
                       main_process_port='"$PET_MASTER_PORT"', job_board_port='"$((PET_MASTER_PORT + 1))"',
                       expect_machines='"$PET_NNODES"', expect_processes_per_node='"$PET_NPROC_PER_NODE"',
                       stall_timeout=options.stall_timeout, node_name='"$(hostname)"')
    return "\n".join(["set -euo pipefail", *options.setup, node.render(), ""])


def resources_per_node(job: ClusterJob, options: KubernetesOptions) -> dict:
    """What each pod requests: its GPUs, its CPUs (a core per process for a CPU job that names none) and memory
    (also its limit: the /dev/shm volume counts against it, and a pod using more than it asked is evicted first)."""
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    cpus = options.resources.cpus or (None if job.gpus_per_node else job.processes_per_node)
    if cpus is not None:
        requests["cpu"] = str(cpus)
    if options.resources.memory is not None:
        requests["memory"] = limits["memory"] = kubernetes_quantity(options.resources.memory)
    if job.gpus_per_node:
        limits[GPU_RESOURCE] = str(job.gpus_per_node)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


# Seconds a pod keeps after its SIGTERM beyond the ranks' preemption grace: the launcher's own exit, the log flush.
TERMINATION_MARGIN = 30


def volumes_patch(options: KubernetesOptions, preemption_grace: float | None = None) -> list[dict]:
    """The pods' volumes, as a runtime patch of the torch-distributed runtime's "node" job: /dev/shm in memory
    (DataLoader workers and NCCL need more than a container's default 64 MiB: SIGBUS), and the shared claims; and
    the pods' termination grace: Kubernetes sends SIGTERM, then SIGKILL after terminationGracePeriodSeconds (30 by
    default), which must outlast the ranks' save (--preemption-grace)."""
    shm: dict = {"medium": "Memory"}
    if options.shm_size is not None:
        shm["sizeLimit"] = kubernetes_quantity(options.shm_size)
    volumes = [{"name": SHM_VOLUME, "emptyDir": shm}]
    mounts = [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}]
    for index, storage in enumerate(options.storage):
        name = f"shared-{index}"
        volumes.append({"name": name, "persistentVolumeClaim": {"claimName": storage.source}})
        mounts.append({"name": name, "mountPath": str(storage.mount)})
    pod: dict = {"volumes": volumes, "containers": [{"name": RUNTIME_CONTAINER, "volumeMounts": mounts}]}
    if preemption_grace:
        pod["terminationGracePeriodSeconds"] = int(preemption_grace) + TERMINATION_MARGIN
    replicated = {"name": RUNTIME_JOB, "template": {"spec": {"template": {"spec": pod}}}}
    return [{"manager": PATCH_MANAGER,
             "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}}}]


def render_trainjob(job: ClusterJob, options: KubernetesOptions, key: str | None = None) -> str:
    """The TrainJob YAML for `job`. `key`: the job board's key (random when not given)."""
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
                "resourcesPerNode": resources_per_node(job, options),
                "command": ["bash", "-c", container_command(options)],
                "env": [{"name": REQUEST_ENV, "value": job.request.to_json()},
                        {"name": "ACCELKIT_JOB_KEY", "value": key or secrets.token_hex(16)}],
            },
            "runtimePatches": volumes_patch(options, job.request.preemption_grace_seconds()),
        },
    }
    header = [f"# Written by: {job.request.command_line}",
              "# Submit with: kubectl apply -f <this file>   (Kubeflow Trainer and its torch-distributed runtime)",
              f"# The image {options.image} must hold accelkit, the job's packages and the project as its working "
              "directory."]
    header += [f"# Shared storage (ReadWriteMany claim {storage.source}) at {storage.mount}: write checkpoints there."
               for storage in options.storage]
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
    if options.shm_size is not None and options.resources.memory is not None \
            and options.shm_size > options.resources.memory:
        raise AccelkitError("--shm-size is more than --mem-per-node: /dev/shm is memory, counted against the pod's",
                            hint="pass a --shm-size below --mem-per-node (a quarter to a half of it is common)")

    def check(job: ClusterJob) -> None:
        check_checkpoints_shared(sharded=job.sharded_checkpoints, nodes=job.nodes, backend=job.backend,
                                 mounts=options.storage, request=job.request, workdir=options.workdir,
                                 flag=KUBERNETES.flag)

    return write_cluster_job(request, KUBERNETES, options, path, force, lambda job: render_trainjob(job, options),
                             workdir=options.workdir, check=check)
