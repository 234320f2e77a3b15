"""What a node of a cluster job is asked for (CPUs, memory), and the ceilings no scheduler would grant past.

Every target asks per node, because every target runs one accelkit launcher per node that starts the node's ranks:
SLURM's one task per node needs `--cpus-per-task` = all the CPUs of the node's ranks (its data loaders included),
a TrainJob pod requests them, a SkyPilot node is chosen with at least that many. Without a request a SLURM job gets
one CPU per node ("using 2 processors on nodes n[1-2]" for 2 x 8 GPU ranks): every rank of a node would share it.

The ceilings are generous on purpose (what the largest real machines and clusters have, not what is typical): they
catch a typo or a unit slip (5,000,000 nodes, 4,096 GPUs in one machine) before a scheduler answers with a pending
job that never starts, or a cloud with a bill.
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.errors import AccelkitError
from accelkit.sizes import format_bytes, parse_bytes

# The largest clusters one scheduler runs are tens of thousands of machines (GKE documents 65,000-node clusters;
# the largest SLURM systems have ~10,000-20,000 nodes).
MAX_NODES = 65_536
# The most GPUs one machine holds: 8 on HGX/DGX and MI300X boards, 16 on HGX-2/DGX-2, up to 32 in the largest
# single-system servers; 64 leaves room.
MAX_GPUS_PER_NODE = 64
# The most CPUs (hardware threads, as SLURM and Kubernetes count them) of one machine: 2 x 192-core CPUs with SMT
# give 768, 32-socket single-system servers ~1,800.
MAX_CPUS_PER_NODE = 2_048
# The most memory one machine holds: 2-socket servers reach 6-12 TiB, the largest single-system servers 48 TiB.
MAX_MEMORY_PER_NODE = 64 * 2**40

# What a pod asks for per process when the user names nothing (a TrainJob: a pod with no CPU or memory request is
# BestEffort, the first evicted under memory pressure, and its ranks share whatever CPUs are left). A GPU rank: a
# core for the rank and 7 for its DataLoader workers, and 32 GiB (its copy of the model while it loads, its
# batches, pinned buffers). Every multi-GPU cloud machine has at least that per GPU: 12 vCPUs and 85-144 GiB per
# GPU on A100 machines (AWS p4d, GCP a2, Azure ND A100 v4), 12-26 vCPUs and 230-256 GiB on H100 ones, 12 vCPUs and
# 48 GiB on 4-GPU g4dn/g5 ones. A CPU rehearsal's rank (--cpu): a core and 4 GiB (small models, gloo).
GPU_RANK_CPUS = 8
GPU_RANK_MEMORY = 32 * 2**30
CPU_RANK_CPUS = 1
CPU_RANK_MEMORY = 4 * 2**30


@dataclass(frozen=True)
class NodeResources:
    """CPUs and memory for one node (None: not asked; each target then says what it does by default)."""

    cpus: int | None = None
    memory: int | None = None  # bytes

    @property
    def given(self) -> bool:
        return self.cpus is not None or self.memory is not None


def per_process_resources(cpu: bool) -> NodeResources:
    """The documented CPUs and memory of one process (GPU rank, or a --cpu rehearsal's rank)."""
    return NodeResources(cpus=CPU_RANK_CPUS, memory=CPU_RANK_MEMORY) if cpu else \
        NodeResources(cpus=GPU_RANK_CPUS, memory=GPU_RANK_MEMORY)


def with_defaults(resources: NodeResources, processes_per_node: int, cpu: bool) -> NodeResources:
    """`resources`, with what was not given derived from the node's processes x the per-process figures."""
    each = per_process_resources(cpu)
    assert each.cpus is not None and each.memory is not None
    return NodeResources(cpus=resources.cpus or each.cpus * processes_per_node,
                         memory=resources.memory or each.memory * processes_per_node)


def parse_memory(text: str | None, option: str) -> int | None:
    """A memory size from the command line (`512GiB`, `64GB`), within what one machine can hold."""
    if text is None:
        return None
    size = parse_bytes(text, option)
    if size > MAX_MEMORY_PER_NODE:
        raise AccelkitError(f"{option} {text} is more than any one machine has (at most "
                            f"{format_bytes(MAX_MEMORY_PER_NODE)})",
                            hint=f"give the memory of one node, e.g. {option} 512GiB")
    if size < 2**20:
        raise AccelkitError(f"{option} {text} is less than 1 MiB, the smallest amount a scheduler grants",
                            hint=f"give the memory of one node with its unit, e.g. {option} 512GiB")
    return size


def check_shape_ceilings(nodes: int, per_node: int, cpu: bool) -> None:
    """Refuse a job shape no scheduler would grant: more nodes than any cluster, more GPUs (or, with --cpu, more
    processes) than any one machine."""
    if nodes > MAX_NODES:
        raise AccelkitError(f"--num-machines {nodes:,} is more nodes than any cluster has (at most {MAX_NODES:,})",
                            hint="give the number of machines (nodes) the job runs on, e.g. --num-machines 4")
    if cpu and per_node > MAX_CPUS_PER_NODE:
        raise AccelkitError(f"{per_node:,} processes per node is more than any one machine has CPUs for (at most "
                            f"{MAX_CPUS_PER_NODE:,})", hint="give the processes of one node, e.g. --gpus-per-node 8")
    if not cpu and per_node > MAX_GPUS_PER_NODE:
        raise AccelkitError(f"{per_node:,} GPUs per node is more than any one machine holds (at most "
                            f"{MAX_GPUS_PER_NODE})",
                            hint="give the GPUs of one node, e.g. --gpus-per-node 8 (--num-processes is the total)")


def check_resources(resources: NodeResources, processes_per_node: int, cpu: bool) -> None:
    """Refuse CPUs no machine has, or fewer CPUs than the node's GPU ranks (each GPU rank drives its GPU from a
    core of its own, data loaders besides). A CPU rehearsal (--cpu) may share cores: it checks behaviour, not
    speed."""
    cpus = resources.cpus
    if cpus is None:
        return
    if cpus > MAX_CPUS_PER_NODE:
        raise AccelkitError(f"--cpus-per-node {cpus:,} is more CPUs than any one machine has (at most "
                            f"{MAX_CPUS_PER_NODE:,})", hint="give the CPUs of one node for all its ranks, e.g. "
                                                            "--cpus-per-node 64")
    if not cpu and cpus < processes_per_node:
        raise AccelkitError(f"--cpus-per-node {cpus} is fewer than the node's {processes_per_node} GPU ranks: they "
                            "would share cores (a many-fold slowdown, and no error)",
                            hint=f"ask for at least one CPU per rank and some for its data loaders, e.g. "
                                 f"--cpus-per-node {processes_per_node * 8}")


def mebibytes(size: int) -> int:
    """`size` in whole MiB, rounded up (SLURM's `--mem=NM` and Kubernetes' `Mi` are MiB)."""
    return -(-size // 2**20)


def kubernetes_quantity(size: int) -> str:
    """A Kubernetes quantity for `size` bytes: `64Gi` when whole GiB, else MiB rounded up."""
    return f"{size // 2**30}Gi" if size % 2**30 == 0 else f"{mebibytes(size)}Mi"
