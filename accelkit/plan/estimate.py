"""One row of the plan: what a strategy needs per GPU (worst rank) and per node, and whether it fits.

Headroom: what the plan does not model (the CUDA context, kernels' workspaces such as cuBLAS and NCCL buffers,
allocator fragmentation) is kept free: 1 GiB per GPU plus 10% of its memory. On the CPU side 10% of a node's
memory is kept for the OS, data loading and pinned-memory overhead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelkit.errors import AccelkitError
from accelkit.plan import buffers, states
from accelkit.plan.catalog import Strategy
from accelkit.plan.inputs import Hardware, Training
from accelkit.plan.shape import ModelShape
from accelkit.plan.traffic import Traffic, traffic

CUDA_RESERVE = 1 << 30  # CUDA context + cuBLAS/cuDNN/NCCL workspaces, not modelled
FRAGMENTATION = 0.10  # share of GPU memory kept for the caching allocator's fragmentation
CPU_RESERVE = 0.10  # share of a node's memory kept for the OS, data loaders and pinned buffers
MAX_RANKS_SCANNED = 4096  # per-rank figures differ by padding only; beyond this, scan a sample of ranks


@dataclass(frozen=True)
class Estimate:
    strategy: Strategy
    unavailable: str | None  # why it cannot run on this hardware; None when it can
    states: states.States  # model states on each GPU (the worst rank)
    activations: int | None  # None: not modelled
    parts: tuple[buffers.Part, ...]
    cpu_per_node: int
    traffic: Traffic
    accumulation: int
    gpu_usable: int | None
    cpu_usable: int | None
    worst_rank: int = 0

    @property
    def buffers(self) -> int:
        return sum(p.bytes for p in self.parts)

    @property
    def total(self) -> int:
        return self.states.total + (self.activations or 0) + self.buffers

    @property
    def headroom(self) -> int | None:
        return None if self.gpu_usable is None else self.gpu_usable - self.total

    @property
    def cpu_fits(self) -> bool | None:
        if self.cpu_per_node == 0:
            return True
        return None if self.cpu_usable is None else self.cpu_per_node <= self.cpu_usable

    @property
    def gpu_fits(self) -> bool | None:
        return None if self.gpu_usable is None else self.total <= self.gpu_usable

    @property
    def fits(self) -> bool | None:
        """False when the strategy cannot run here, or needs CPU memory that is short or not known (an offload
        row is never judged to fit on an unknown machine); None when the GPU memory is unknown."""
        if self.unavailable is not None:
            return False
        if self.gpu_usable is None:
            return None
        return self.gpu_fits is True and self.cpu_fits is True


def usable_gpu(memory: int | None) -> int | None:
    return None if memory is None else int(memory * (1 - FRAGMENTATION)) - CUDA_RESERVE


def usable_cpu(memory: int | None) -> int | None:
    return None if memory is None else int(memory * (1 - CPU_RESERVE))


def _ranks(world: int) -> list[int]:
    if world <= MAX_RANKS_SCANNED:
        return list(range(world))
    step = world // MAX_RANKS_SCANNED
    return sorted({*range(0, world, step), world - 1})


def rank_states(strategy: Strategy, shape: ModelShape, dt: states.Dtypes, optimizer: str, world: int,
                rank: int) -> states.States:
    """Model states one rank holds (on its GPU, or on the CPU when the strategy offloads them)."""
    if strategy.family == "torch":
        return states.replicated(shape, dt, optimizer)
    if strategy.family == "fsdp":
        return states.fsdp2(shape, dt, optimizer, world, rank)
    if strategy.zero_stage == 3:
        return states.zero3(shape, dt, optimizer, world)
    return states.zero12(shape, dt, optimizer, world, rank, strategy.zero_stage)


def estimate(strategy: Strategy, shape: ModelShape, hardware: Hardware, training: Training,
             activations: int | None, weight_copies: int) -> Estimate:
    unavailable = strategy.not_applicable(hardware.gpus, hardware.nodes)
    world = hardware.gpus if strategy.distributed else 1
    shard_world = hardware.gpus_per_node if strategy.sharding == "hybrid" else world
    try:
        accumulation = training.accumulation(world)
    except AccelkitError:
        if strategy.distributed:
            raise
        accumulation = 1  # the one-GPU reference row of a multi-GPU plan
    dt = states.dtypes_for(strategy.family, training.precision)
    compute_bytes = 4 if training.precision == "fp32" else 2
    per_rank = [(rank_states(strategy, shape, dt, training.optimizer, shard_world, r), r)
                for r in _ranks(shard_world)]
    held, worst = max(per_rank, key=lambda item: item[0].total)
    cpu = 0
    if strategy.offload:
        resident = _resident_on_gpu(strategy, shape, dt, world)
        on_cpu = held.total - resident
        if strategy.family == "deepspeed":  # the CPU optimizer steps on fp32 gradients: 4 bytes, not 2
            on_cpu += held.gradients * (4 - dt.grad) // dt.grad
        cpu = on_cpu * hardware.gpus_per_node
        held = states.States(resident, 0, 0)
    if strategy.family == "torch":
        parts = buffers.torch_parts(strategy, shape, dt, weight_copies)
    elif strategy.family == "fsdp":
        parts = buffers.fsdp_parts(strategy, shape, compute_bytes, shard_world, accumulation)
    else:
        parts = buffers.zero_parts(strategy, shape, dt, world)
        if strategy.offload:  # the fp32 step happens on the CPU
            parts = [p for p in parts if not p.what.startswith("fp32 gradient partition")]
    flow = traffic(strategy, shape, dt, compute_bytes, hardware.gpus, hardware.nodes, accumulation) \
        if unavailable is None else Traffic(0, 0)
    return Estimate(strategy=strategy, unavailable=unavailable, states=held, activations=activations,
                    parts=tuple(parts), cpu_per_node=cpu, traffic=flow, accumulation=accumulation,
                    gpu_usable=usable_gpu(hardware.gpu_memory), cpu_usable=usable_cpu(hardware.cpu_memory),
                    worst_rank=worst)


def _resident_on_gpu(strategy: Strategy, shape: ModelShape, dt: states.Dtypes, world: int) -> int:
    """Parameters an offloading strategy still keeps on the GPU: ZeRO-3's persistent small parameters (gathered)."""
    if strategy.family != "deepspeed" or not shape.exact:
        return 0
    return sum(math.ceil(t.numel / world) * world * dt.param for t in shape.tensors
               if t.numel <= states.PERSISTENCE_THRESHOLD)
