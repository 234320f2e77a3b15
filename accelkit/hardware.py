"""What this machine has: GPUs (count, memory of the smallest, name), CPU cores this process may use, RAM.

The one place accelkit asks torch about devices, so `config`, `launch`, `bench` and `plan` count the same GPUs.
torch is imported only when a question is actually asked, and not at all on a machine without a GPU driver (importing
torch costs about a second of CPU, more than writing a config); a broken CUDA install counts as no GPU.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

# Device nodes a GPU driver creates, also inside containers given GPUs (the NVIDIA container toolkit mounts them):
# NVIDIA, AMD ROCm (which torch.cuda also reports), WSL's GPU paravirtualization.
_DRIVER_NODES = ("/dev/nvidiactl", "/dev/nvidia[0-9]*", "/dev/kfd", "/dev/dxg", "/proc/driver/nvidia")


@dataclass(frozen=True)
class LocalGpus:
    count: int
    memory: int | None  # bytes of the smallest GPU
    name: str | None


def gpu_driver_present() -> bool:
    """Whether this machine could have a GPU torch sees: no driver node, no GPU (and no need to import torch)."""
    return any(glob.glob(pattern) for pattern in _DRIVER_NODES)


def gpu_count() -> int:
    """CUDA devices this process can see (CUDA_VISIBLE_DEVICES applies)."""
    if not gpu_driver_present():
        return 0
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:  # a broken CUDA install must not stop a config from being written
        return 0


def local_gpus() -> LocalGpus:
    if not gpu_driver_present():
        return LocalGpus(0, None, None)
    try:
        import torch

        if not torch.cuda.is_available():
            return LocalGpus(0, None, None)
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA install plans like a machine without GPUs
        return LocalGpus(0, None, None)
    if not props:
        return LocalGpus(0, None, None)
    smallest = min(props, key=lambda p: p.total_memory)
    return LocalGpus(len(props), int(smallest.total_memory), smallest.name)


def cpu_cores() -> int:
    """The CPU cores this process may run on (its affinity mask: a container's or taskset's limit applies)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def local_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
