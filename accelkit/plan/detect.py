"""What this machine has, for the plan's defaults: GPUs (count, memory of the smallest, name) and RAM."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LocalGpus:
    count: int
    memory: int | None  # bytes of the smallest GPU
    name: str | None


def local_gpus() -> LocalGpus:
    try:
        import torch

        if not torch.cuda.is_available():
            return LocalGpus(0, None, None)
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except Exception:  # a broken CUDA install plans like a machine without GPUs
        return LocalGpus(0, None, None)
    smallest = min(props, key=lambda p: p.total_memory)
    return LocalGpus(len(props), int(smallest.total_memory), smallest.name)


def local_memory() -> int:
    import psutil

    return int(psutil.virtual_memory().total)
