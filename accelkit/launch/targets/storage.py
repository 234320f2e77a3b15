"""Storage every node of a SkyPilot or Kubernetes job shares, and the refusal of a sharded checkpoint that would be
scattered over the nodes' own disks.

FSDP (sharded state dict) and DeepSpeed (ZeRO optimizer and parameter shards) checkpoints are written by every rank:
on a multi-node job whose output folder is each node's own disk (SkyPilot's copied workdir, a pod's file system),
one checkpoint ends up split over the machines, and resume, preemption recovery and `merge-ckpt` all fail hours
later. SLURM jobs run in a working directory on the cluster's shared file system (its preflight checks it); the
other targets mount shared storage with `--storage MOUNT=SOURCE`:
- SkyPilot: SOURCE is a bucket (s3://, gs://, r2://, cos://, oci://, or an Azure https://ACCOUNT.blob.core.windows.net
  container URL), mounted on every node by `file_mounts` (mode MOUNT);
- Kubernetes: SOURCE is a ReadWriteMany PersistentVolumeClaim's name, mounted in every pod.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from accelkit.errors import AccelkitError
from accelkit.launch.request import LaunchRequest

BUCKET_SCHEMES = ("s3://", "gs://", "r2://", "cos://", "oci://", "https://")
# A PersistentVolumeClaim's name is a DNS-1123 subdomain.
_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
# The script options that name where a training script writes its checkpoints (accelkit's templates: --output-dir).
OUTPUT_OPTIONS = ("--output-dir", "--output_dir", "--checkpoint-dir", "--checkpoint_dir", "--save-dir", "--save_dir")
TEMPLATE_OUTPUT = "outputs"  # where accelkit's templates write without --output-dir (beside the script)


@dataclass(frozen=True)
class SharedMount:
    """`--storage MOUNT=SOURCE`: shared storage at the absolute path MOUNT on every node."""

    mount: PurePosixPath
    source: str


def parse_storage(value: str, scheduler: str) -> SharedMount:
    """One `--storage MOUNT=SOURCE` for `scheduler` ("SkyPilot" or "Kubernetes"), or a one-line refusal."""
    mount, sep, source = value.partition("=")
    example = "/checkpoints=s3://my-bucket" if scheduler == "SkyPilot" else "/checkpoints=my-rwx-claim"
    if not sep or not mount or not source:
        raise AccelkitError(f"--storage {value!r} is not MOUNT=SOURCE", hint=f"e.g. --storage {example}")
    path = PurePosixPath(mount)
    if not path.is_absolute() or path == PurePosixPath("/") or ".." in path.parts or any(c.isspace() for c in mount):
        raise AccelkitError(f"--storage mount point {mount!r} is not an absolute folder on the nodes",
                            hint=f"mount it at an absolute path such as /checkpoints, e.g. --storage {example}")
    if scheduler == "SkyPilot" and not source.startswith(BUCKET_SCHEMES):
        raise AccelkitError(f"--storage source {source!r} is not a bucket SkyPilot can mount",
                            hint="name a bucket: s3://, gs://, r2://, cos://, oci:// or an Azure https:// container "
                                 f"URL, e.g. --storage {example}")
    if scheduler == "Kubernetes" and not _CLAIM.match(source):
        raise AccelkitError(f"--storage source {source!r} is not a PersistentVolumeClaim name",
                            hint="name a ReadWriteMany claim in the job's namespace (lowercase letters, digits, '-' "
                                 f"and '.'), e.g. --storage {example}")
    return SharedMount(mount=path, source=source)


def parse_storages(values: tuple[str, ...], scheduler: str) -> tuple[SharedMount, ...]:
    mounts = tuple(parse_storage(value, scheduler) for value in values)
    points = [mount.mount for mount in mounts]
    for index, point in enumerate(points):
        for other in points[index + 1:]:
            if point == other or point in other.parents or other in point.parents:
                raise AccelkitError(f"--storage mount points {point} and {other} overlap",
                                    hint="mount each storage at its own folder, e.g. /checkpoints and /data")
    return mounts


def script_output_dir(request: LaunchRequest, workdir: Path) -> str | None:
    """Where the script writes its checkpoints: the value of its output option (--output-dir, ...), the templates'
    default `outputs` when the script is accelkit's template, or None when unknown (a script of the user's own)."""
    args = list(request.target.args)
    for index, arg in enumerate(args):
        for option in OUTPUT_OPTIONS:
            if arg == option and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(option + "="):
                return arg[len(option) + 1:]
    if not request.target.module:
        try:
            source = (workdir / request.target.script).read_text(errors="replace")
        except OSError:
            return None
        if '"--output-dir"' in source and "resume_from_checkpoint" in source:  # accelkit's templates
            return str(PurePosixPath(request.target.script).parent / TEMPLATE_OUTPUT)
    return None


def check_checkpoints_shared(*, sharded: bool, nodes: int, backend: str, mounts: tuple[SharedMount, ...],
                             request: LaunchRequest, workdir: Path, flag: str) -> None:
    """Refuse a multi-node job with sharded checkpoints that would write them to each node's own disk: without
    shared storage, or with an output folder (known from the script's options) outside it."""
    if not sharded or nodes < 2:
        return
    output = script_output_dir(request, workdir)
    example = mounts[0].mount if mounts else PurePosixPath("/checkpoints")
    source = "s3://BUCKET" if flag == "--skypilot" else "RWX-CLAIM"
    if not mounts:
        raise AccelkitError(f"a {nodes}-node {backend} job writes sharded checkpoints from every node: on the nodes' "
                            f"own disks one checkpoint would be split over {nodes} machines (resume and merge-ckpt "
                            "would fail)",
                            hint=f"mount shared storage with --storage /checkpoints={source} and point the script's "
                                 "--output-dir there, e.g. --output-dir /checkpoints/run1")
    if output is None:
        return  # a script of the user's own: the job file says where the shared storage is mounted
    path = PurePosixPath(output)
    if not any(path == mount.mount or mount.mount in path.parents for mount in mounts):
        raise AccelkitError(f"the script writes its checkpoints to {output}, on each node's own disk, not under the "
                            f"shared storage ({', '.join(str(mount.mount) for mount in mounts)}): one {backend} "
                            f"checkpoint would be split over {nodes} machines",
                            hint=f"pass the script --output-dir {example}/run1 (after the script's name)")
