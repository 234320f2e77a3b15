"""Write a Kubeflow Trainer TrainJob that runs one supervised accelkit launcher per node (`kubectl apply -f`).

The Trainer (trainer.kubeflow.org/v1alpha1) starts `numNodes` pods from the `torch-distributed` runtime, each with
`resourcesPerNode`, and sets PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR and PET_MASTER_PORT
in the trainer container (torchrun's own variables). The container's command is the per-node command
(node_command.py) reading them: machine 0 (PET_NODE_RANK 0, at PET_MASTER_ADDR) hosts the job board on the port
after PET_MASTER_PORT, and each pod checks the runtime's counts against the job it was written for. The image
holds accelkit, the packages and the project (the command runs in the image's working directory). Each pod
requests CPUs and memory (BestEffort pods are evicted first), has a /dev/shm in memory, and reads the job board's key
from a Secret made once where the job is submitted (the TrainJob names it; the key is in no file).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.cluster.job_board import KEY_ENV
from accelkit.launch.cluster.targets.cluster_job import (
    ClusterJob,
    ClusterTarget,
    JobOptions,
    write_cluster_job,
    yaml_document,
)
from accelkit.launch.cluster.targets.job_key import NEW_KEY
from accelkit.launch.cluster.targets.node_command import NodeCommand
from accelkit.launch.cluster.targets.node_resources import (
    NodeResources,
    kubernetes_quantity,
    per_process_resources,
    with_defaults,
)
from accelkit.launch.cluster.targets.storage import SharedMount, check_checkpoints_shared
from accelkit.launch.request import LaunchRequest
from accelkit.sizes import format_bytes

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
SHM_SHARE = 2  # /dev/shm's default size limit: 1/2 of the pod's memory request
SECRET_KEY = "key"  # the key of the job board's key in its Secret


@dataclass(frozen=True, kw_only=True)
class KubernetesOptions(JobOptions):
    """What only Kubernetes is asked for (the job's shape and the request are the ClusterJob's)."""

    image: str | None  # None: refused (the runtime's default image has no accelkit)
    workdir: Path = Path(".")  # the project: the image holds it as its working directory
    storage: tuple[SharedMount, ...] = ()  # ReadWriteMany claims mounted in every pod (sharded checkpoints go there)
    shm_size: int | None = None  # bytes: the /dev/shm memory volume's size limit (None: half the pod's memory)


def container_command(options: KubernetesOptions) -> str:
    node = NodeCommand(machine_rank='"$PET_NODE_RANK"', main_process_ip='"$PET_MASTER_ADDR"',
                       main_process_port='"$PET_MASTER_PORT"', job_board_port='"$((PET_MASTER_PORT + 1))"',
                       expect_machines='"$PET_NNODES"', expect_processes_per_node='"$PET_NPROC_PER_NODE"',
                       stall_timeout=options.stall_timeout, node_name='"$(hostname)"')
    return "\n".join(["set -euo pipefail", *options.setup, node.render(), ""])


def node_resources(job: ClusterJob, options: KubernetesOptions) -> NodeResources:
    """The CPUs and memory each pod requests: what was given, else the node's processes x the per-process figures
    (node_resources.py)."""
    return with_defaults(options.resources, job.processes_per_node, job.cpu)


def shm_size(job: ClusterJob, options: KubernetesOptions) -> int:
    """The /dev/shm volume's size limit: --shm-size, else half the pod's memory request (the volume is memory,
    counted against the pod's; the other half is the processes' own)."""
    if options.shm_size is not None:
        return options.shm_size
    memory = node_resources(job, options).memory
    assert memory is not None
    return memory // SHM_SHARE


def resources_per_node(job: ClusterJob, options: KubernetesOptions) -> dict:
    """What each pod requests: its GPUs, CPUs and memory, so the pod is Burstable, not BestEffort (the first evicted
    under memory pressure). No CPU limit (a data loader's burst is not throttled). A memory limit only for the
    memory the user gave (--mem-per-node): past it the container is OOM-killed, which a default must not risk."""
    resources = node_resources(job, options)
    requests = {"cpu": str(resources.cpus), "memory": kubernetes_quantity(resources.memory or 0)}
    limits: dict[str, str] = {}
    if options.resources.memory is not None:
        limits["memory"] = requests["memory"]
    if job.gpus_per_node:
        limits[GPU_RESOURCE] = str(job.gpus_per_node)
    return {key: value for key, value in (("requests", requests), ("limits", limits)) if value}


def key_secret(job_name: str) -> str:
    """The Secret that holds the job board's key: named after the job (a DNS-1123 label, so the name is one too)."""
    return f"{job_name}-job-key"


def create_secret_command(job_name: str) -> str:
    """The command that makes the job's Secret once, with a fresh random key (never written to a file)."""
    return f"kubectl create secret generic {key_secret(job_name)} --from-literal={SECRET_KEY}={NEW_KEY}"


# Seconds a pod keeps after its SIGTERM beyond the ranks' preemption grace: the launcher's own exit, the log flush.
TERMINATION_MARGIN = 30


def volumes_patch(job: ClusterJob, options: KubernetesOptions, preemption_grace: float | None = None) -> list[dict]:
    """The pods' volumes, as a runtime patch of the torch-distributed runtime's "node" job: /dev/shm in memory
    (DataLoader workers and NCCL need more than a container's default 64 MiB: SIGBUS), and the shared claims; and
    the pods' termination grace: Kubernetes sends SIGTERM, then SIGKILL after terminationGracePeriodSeconds (30 by
    default), which must outlast the ranks' save (--preemption-grace)."""
    shm = {"medium": "Memory", "sizeLimit": kubernetes_quantity(shm_size(job, options))}
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


def render_trainjob(job: ClusterJob, options: KubernetesOptions) -> str:
    """The TrainJob YAML for `job`. The job board's key comes from a Secret (create_secret_command), never from the
    file: whoever reads the TrainJob (kubectl get -o yaml) cannot post to the board."""
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
                        {"name": KEY_ENV, "valueFrom": {"secretKeyRef": {"name": key_secret(options.job_name),
                                                                          "key": SECRET_KEY}}}],
            },
            "runtimePatches": volumes_patch(job, options, job.request.preemption_grace_seconds()),
        },
    }
    header = [f"# Written by: {job.request.command_line}",
              f"# Once, the job board's key (a Secret): {create_secret_command(options.job_name)}",
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

    def check(job: ClusterJob) -> None:
        check_shm_size(job, options)
        check_checkpoints_shared(sharded=job.sharded_checkpoints, nodes=job.nodes, backend=job.backend,
                                 mounts=options.storage, request=job.request, workdir=options.workdir,
                                 flag=KUBERNETES.flag)

    return write_cluster_job(request, KUBERNETES, options, path, force, lambda job: render_trainjob(job, options),
                             workdir=options.workdir, check=check)


def check_shm_size(job: ClusterJob, options: KubernetesOptions) -> None:
    """/dev/shm is memory counted against the pod's: --shm-size must fit in the pod's memory request."""
    memory = node_resources(job, options).memory
    if options.shm_size is None or memory is None or options.shm_size <= memory:
        return
    if options.resources.memory is not None:
        raise AccelkitError("--shm-size is more than --mem-per-node: /dev/shm is memory, counted against the pod's",
                            hint="pass a --shm-size below --mem-per-node (a quarter to a half of it is common)")
    each = per_process_resources(job.cpu).memory or 0
    raise AccelkitError(f"--shm-size {format_bytes(options.shm_size)} is more than the pod's memory request, "
                        f"{format_bytes(memory)} ({format_bytes(each)} x {job.processes_per_node} processes, the "
                        "default without --mem-per-node): /dev/shm is memory, counted against the pod's",
                        hint="pass --mem-per-node above --shm-size, or a smaller --shm-size")
