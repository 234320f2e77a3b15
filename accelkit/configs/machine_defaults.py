"""The defaults a config takes from this machine's GPUs (counted by accelkit.hardware, only when needed)."""

from __future__ import annotations

from accelkit.hardware import gpu_count

# Without GPUs, multi-process backends still default to 2 processes: the smallest setup that really exercises
# DDP/FSDP/DeepSpeed, and what `accelkit launch --cpu` rehearses on CPU processes.
CPU_REHEARSAL_PROCESSES = 2


def default_backend(num_processes: int | None = None, num_machines: int | None = None) -> str:
    """ddp when several processes or machines are asked for, or when this machine has 2+ GPUs; else single."""
    if (num_processes or 0) > 1 or (num_machines or 0) > 1:
        return "ddp"
    return "ddp" if gpu_count() >= 2 else "single"


def default_num_processes(backend: str, num_machines: int) -> int:
    """Total processes across machines when --num-processes is not given."""
    if backend == "single":
        return 1
    gpus = gpu_count() if backend != "cpu" else 0
    per_machine = gpus if gpus > 0 else CPU_REHEARSAL_PROCESSES
    return per_machine * num_machines
