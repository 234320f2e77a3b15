"""What is being planned for: the hardware and the training run, checked, with where each value came from."""

from __future__ import annotations

from dataclasses import dataclass, field

from accelkit.errors import AccelkitError
from accelkit.limits import MAX_BATCH, MAX_PARAMS, MAX_SEQ_LEN
from accelkit.limits import MAX_PROCESSES as MAX_GPUS

# Beyond these, a value is a typo (a missing unit, an extra zero), not a plan: refused with the limit.
MAX_GPU_MEMORY = 4 * 2**40  # per GPU; the largest hold under 300 GB
MAX_CPU_MEMORY = 2**50  # per machine; the largest servers hold a few tens of TB

PRECISIONS = ("fp32", "bf16-mixed", "fp16-mixed", "bf16")
OPTIMIZERS = ("adamw", "sgd-momentum", "sgd", "adafactor")
# Accelerate's mixed_precision value for each precision (pure bf16: the script casts the model itself).
MIXED_PRECISION = {"fp32": "no", "bf16-mixed": "bf16", "fp16-mixed": "fp16", "bf16": "no"}


@dataclass(frozen=True)
class Hardware:
    gpus: int  # total
    nodes: int
    gpu_memory: int | None  # bytes per GPU; None: unknown (fits cannot be judged)
    cpu_memory: int | None  # bytes per node; None: CPU memory is not checked
    sources: dict[str, str] = field(default_factory=dict)  # value name -> where it came from

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes


@dataclass(frozen=True)
class Training:
    precision: str = "bf16-mixed"
    optimizer: str = "adamw"
    seq_len: int = 2048
    micro_batch: int = 1
    activation_checkpointing: bool = False
    global_batch: int | None = None
    base_lr: float | None = None
    base_batch: int | None = None
    sources: dict[str, str] = field(default_factory=dict)

    def accumulation(self, data_parallel: int) -> int:
        """Gradient accumulation steps that make --global-batch with this many data-parallel ranks (1 without)."""
        if self.global_batch is None:
            return 1
        per_step = self.micro_batch * data_parallel
        if self.global_batch % per_step:
            lower = self.global_batch // per_step * per_step
            options = " or ".join(str(v) for v in (lower, lower + per_step) if v > 0)
            micro = f"micro-batch {self.micro_batch}" + (f" ({self.sources['micro_batch']})"
                                                         if "micro_batch" in self.sources else "")
            raise AccelkitError(
                f"--global-batch {self.global_batch} is not a whole number of steps of {per_step} samples "
                f"({micro} x {data_parallel} GPUs): accumulation would be {self.global_batch / per_step:g}",
                hint=f"use --global-batch {options}, or change --micro-batch")
        return self.global_batch // per_step

    def effective_batch(self, data_parallel: int) -> int:
        return self.micro_batch * data_parallel * self.accumulation(data_parallel)


def check_hardware(gpus: int, nodes: int) -> None:
    if gpus < 1:
        raise AccelkitError(f"--num-processes {gpus} must be at least 1",
                            hint="--num-processes is the total number of GPUs")
    if nodes < 1:
        raise AccelkitError(f"--num-machines {nodes} must be at least 1",
                            hint="--num-machines is the number of machines")
    for option, value, what in (("--num-processes", gpus, "the total number of GPUs over all machines"),
                                ("--num-machines", nodes, "the number of machines")):
        if value > MAX_GPUS:
            raise AccelkitError(f"{option} {value:,} is more than any cluster has (the plan stops at {MAX_GPUS:,})",
                                hint=f"check {option}: {what}")
    if gpus % nodes:
        raise AccelkitError(f"--num-processes {gpus} does not divide evenly over --num-machines {nodes}",
                            hint="--num-processes is the total across machines: give a multiple of --num-machines, "
                                 "e.g. "
                                 f"--num-processes {nodes * max(1, gpus // nodes)}")


def check_training(training: Training) -> None:
    for name, value in (("--seq-len", training.seq_len), ("--micro-batch", training.micro_batch)):
        if value < 1:
            raise AccelkitError(f"{name} {value} must be at least 1", hint=f"e.g. {name} 1")
    for name, value, ceiling, what in (
            ("--seq-len", training.seq_len, MAX_SEQ_LEN, "tokens per sample; the longest contexts are a few million"),
            ("--micro-batch", training.micro_batch, MAX_BATCH, "samples per GPU per step"),
            ("--global-batch", training.global_batch, MAX_BATCH, "samples per optimizer step over all GPUs"),
            ("--base-batch", training.base_batch, MAX_BATCH, "the batch the learning rate was tuned for")):
        if value is not None and value > ceiling:
            raise AccelkitError(f"{name} {value:,} is beyond any real run (the plan stops at {ceiling:,})",
                                hint=f"check {name}: {what}")
    if training.global_batch is not None and training.global_batch < 1:
        raise AccelkitError(f"--global-batch {training.global_batch} must be at least 1",
                            hint="--global-batch is the number of samples per optimizer step across all GPUs")
    if (training.base_lr is None) != (training.base_batch is None):
        given, missing = ("--base-lr", "--base-batch") if training.base_lr is not None else \
            ("--base-batch", "--base-lr")
        raise AccelkitError(f"{given} needs {missing} too",
                            hint="give the learning rate you know works (--base-lr) and the batch it was tuned "
                                 "for (--base-batch); the plan scales it to your effective batch")
    if training.base_lr is not None and not training.base_lr > 0:
        raise AccelkitError(f"--base-lr {training.base_lr:g} must be positive", hint="e.g. --base-lr 3e-4")
    if training.base_batch is not None and training.base_batch < 1:
        raise AccelkitError(f"--base-batch {training.base_batch} must be at least 1", hint="e.g. --base-batch 256")


def check_sizes(parameters: int | None, gpu_memory: int | None, cpu_memory: int | None,
                given: dict[str, str]) -> None:
    """Refuse values no real model or machine has: they are typos, and a plan for them would read as advice."""
    if parameters is not None and parameters > MAX_PARAMS:
        raise AccelkitError(f"--params {given['params']} ({parameters:,} parameters) is beyond any model trained "
                            "so far (the plan stops at 10 trillion)",
                            hint="check the count: 7B is 7e9, 70B is 7e10, 1T is 1e12")
    if gpu_memory is not None and gpu_memory > MAX_GPU_MEMORY:
        raise AccelkitError(f"--gpu-memory {given['gpu_memory']} is more than any GPU holds (the largest hold under "
                            f"300 GB; the plan stops at 4 TiB)",
                            hint="give the memory of one GPU, e.g. --gpu-memory 80GB or --gpu-memory 24GiB")
    if cpu_memory is not None and cpu_memory > MAX_CPU_MEMORY:
        raise AccelkitError(f"--cpu-memory {given['cpu_memory']} is more than any machine holds (the plan stops at "
                            "1 PiB per machine)",
                            hint="give the memory of one machine, e.g. --cpu-memory 512GB or --cpu-memory 512GiB")
