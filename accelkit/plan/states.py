"""Model states per rank (parameters, gradients, optimizer states), as each backend really lays them out.

Exact to the byte for the stacks accelkit launches (PyTorch DDP and FSDP2 through Accelerate, DeepSpeed ZeRO 1-3),
from the model's parameter shapes:

- replicated (one device, DDP): every parameter, every trainable gradient, the optimizer state of every tensor.
- FSDP2 (`fully_shard`): each parameter is split along dim 0 into `ceil(d0/N)`-row chunks; every rank stores its
  chunk in a padded buffer of that size (`FSDPParam._sharded_param_data`), gradients land in one padded flat
  reduce-scatter output per unit, and the optimizer state is allocated like the unpadded local chunk (`zeros_like`
  of the DTensor), so the last ranks can hold less.
- ZeRO-1/2 (`DeepSpeedZeroOptimizer`): each optimizer group is flattened into one 16-bit buffer padded to a
  multiple of 2N elements (`nccl_start_alignment_factor` x N) and cut into N equal partitions; each rank keeps an
  fp32 copy of its partition (the master weights) and the optimizer state of that 1-D partition. Gradients: ZeRO-1
  holds every full 16-bit gradient when the backward ends; ZeRO-2 copies them, bucket by bucket, into one buffer
  sized by the whole parameters that touch its partition (`grads_in_partition`), and the last rank's step adds
  its partition's padding as zeros.
- ZeRO-3 (`DeepSpeedZeroOptimizer_Stage3`): each parameter is padded to a multiple of N and split; small
  parameters (<= `stage3_param_persistence_threshold`, 1e5 elements by default) also stay gathered on every rank
  after the first forward (in their padded all-gather buffer). Gradients live in one flat 16-bit partition buffer,
  the master weights and optimizer state are fp32 partitions.

Where the ZeRO paper's accounting (2P weights + 2P gradients + 12P fp32 state, divided by N per stage) and these
differ: Accelerate's mixed precision keeps DDP and FSDP2 parameters and gradients in fp32 (4P + 4P + 8P: the same
16P, made differently), DeepSpeed keeps an fp32 master copy even in fp32 training, and a factored optimizer
(Adafactor) loses its factoring on DeepSpeed's flat 1-D partitions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelkit.plan.shape import ModelShape

STEP_BYTES = 4  # torch optimizers keep `step` as a float32 scalar tensor per parameter (per flat group in ZeRO)
ZERO_ALIGNMENT_FACTOR = 2  # DeepSpeed: nccl_start_alignment_factor (4-byte alignment of 16-bit elements)
PERSISTENCE_THRESHOLD = 100_000  # DeepSpeed: stage3_param_persistence_threshold default
SUB_GROUP_SIZE = 1_000_000_000  # DeepSpeed: zero_optimization.sub_group_size default (elements)
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class Dtypes:
    """What each kind of state is stored in, for one backend and precision (element sizes in bytes)."""

    param: int  # parameters as the backend stores them
    grad: int  # gradients
    master: int  # a separate fp32 copy of the parameters (DeepSpeed), 0 when there is none
    state: int  # optimizer moments


@dataclass(frozen=True)
class States:
    parameters: int
    gradients: int
    optimizer: int  # optimizer moments, plus DeepSpeed's fp32 master partition

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer


def dtypes_for(family: str, precision: str) -> Dtypes:
    """family: torch (one device / DDP) | fsdp | deepspeed; precision: fp32 | bf16-mixed | fp16-mixed | bf16."""
    if family == "deepspeed":
        low = 4 if precision == "fp32" else 2
        return Dtypes(param=low, grad=low, master=4, state=4)
    width = 2 if precision == "bf16" else 4  # Accelerate's mixed precision: fp32 weights, autocast computes
    return Dtypes(param=width, grad=width, master=0, state=width)


def optimizer_state(optimizer: str, shape: tuple[int, ...], width: int) -> int:
    """Bytes of one tensor's optimizer state (torch.optim.AdamW, SGD(momentum), SGD, Adafactor)."""
    numel = math.prod(shape)
    if optimizer == "adamw":
        return 2 * numel * width + STEP_BYTES
    if optimizer == "sgd-momentum":
        return numel * width
    if optimizer == "sgd":
        return 0
    if optimizer == "adafactor":
        if len(shape) >= 2:  # row and column factors of the second moment
            rows = math.prod(shape[:-1])
            cols = math.prod(shape[:-2]) * shape[-1]
            return (rows + cols) * width + STEP_BYTES
        return numel * width + STEP_BYTES
    raise ValueError(optimizer)


def chunk_rows(rows: int, world: int, rank: int) -> tuple[int, int]:
    """(padded rows, this rank's rows) of torch.chunk along dim 0, as FSDP2 shards."""
    padded = math.ceil(rows / world) if rows else 0
    mine = max(0, min(padded, rows - rank * padded))
    return padded, mine


def replicated(shape: ModelShape, dt: Dtypes, optimizer: str) -> States:
    if not shape.exact:
        n = shape.parameters
        per_param = {"adamw": 2, "sgd-momentum": 1, "sgd": 0, "adafactor": 1}[optimizer]  # adafactor: unfactored
        return States(n * dt.param, n * dt.grad, n * dt.state * per_param)
    params = sum(t.numel for t in shape.tensors) * dt.param
    trainable = shape.trainable_tensors()
    grads = sum(t.numel for t in trainable) * dt.grad
    return States(params, grads, sum(optimizer_state(optimizer, t.shape, dt.state) for t in trainable))


def fsdp2(shape: ModelShape, dt: Dtypes, optimizer: str, world: int, rank: int) -> States:
    if not shape.exact:
        n = shape.parameters
        base = replicated(shape, dt, optimizer)
        return States(math.ceil(n / world) * dt.param, math.ceil(n / world) * dt.grad,
                      math.ceil(base.optimizer / world))
    params = grads = optim = 0
    for t in shape.tensors:
        rows, rest = (t.shape[0], math.prod(t.shape[1:])) if t.shape else (1, 1)
        padded, mine = chunk_rows(rows, world, rank)
        params += padded * rest * dt.param
        if t.trainable:
            grads += padded * rest * dt.grad
            optim += optimizer_state(optimizer, (mine, *t.shape[1:]) if t.shape else (), dt.state)
    return States(params, grads, optim)


def _groups(shape: ModelShape) -> list[list[int]]:
    """Sizes of the optimizer groups' parameters, in group order (count-only shapes: one group)."""
    if not shape.exact:
        return [[shape.parameters]]
    groups = shape.groups or (tuple(i for i, t in enumerate(shape.tensors) if t.trainable),)
    return [[shape.tensors[i].numel for i in group] for group in groups]


def _frozen_bytes(shape: ModelShape, width: int) -> int:
    return sum(t.numel for t in shape.tensors or () if not t.trainable) * width


def zero12(shape: ModelShape, dt: Dtypes, optimizer: str, world: int, rank: int, stage: int) -> States:
    params = grads = optim = 0
    for sizes in _groups(shape):
        total = sum(sizes)
        alignment = ZERO_ALIGNMENT_FACTOR * world
        padded = math.ceil(total / alignment) * alignment
        partition = padded // world
        params += padded * dt.param
        optim += partition * dt.master + optimizer_state(optimizer, (partition,), dt.state)
        if stage == 1:
            grads += total * dt.grad  # every full gradient, until the reduction after the backward
        else:
            start, end = rank * partition, (rank + 1) * partition
            offset = touching = 0
            for size in sizes:
                if offset < end and offset + size > start:
                    touching += size
                offset += size
            grads += touching * dt.grad
            if rank == world - 1:  # the step sees the last partition with its padding, as zeros of its own
                grads += (padded - total) * dt.grad
    return States(params + _frozen_bytes(shape, dt.param), grads, optim)


def zero12_partition_sizes(shape: ModelShape, world: int) -> list[int]:
    """Each optimizer group's partition size (elements per rank) under ZeRO-1/2."""
    alignment = ZERO_ALIGNMENT_FACTOR * world
    return [math.ceil(sum(sizes) / alignment) * alignment // world for sizes in _groups(shape)]


def zero3_subgroups(shape: ModelShape, world: int, sub_group_size: int = SUB_GROUP_SIZE) -> list[int]:
    """Partition elements per rank of each ZeRO-3 sub-group: each optimizer group is cut, in parameter order,
    once its partitions reach sub_group_size (`_create_fp16_sub_groups`); each sub-group has its own fp32 copy and
    optimizer state, and the step converts one sub-group's gradients to fp32 at a time."""
    if not shape.exact:
        return [math.ceil(shape.parameters / world)]
    out = []
    for group in shape.groups or (tuple(i for i, t in enumerate(shape.tensors) if t.trainable),):
        parts = [math.ceil(shape.tensors[i].numel / world) for i in group]
        if sum(parts) <= sub_group_size:
            out.append(sum(parts))
            continue
        current = 0
        for index, part in enumerate(parts):
            current += part
            if current >= sub_group_size or index == len(parts) - 1:
                out.append(current)
                current = 0
    return out


def zero3(shape: ModelShape, dt: Dtypes, optimizer: str, world: int,
          persistence_threshold: int = PERSISTENCE_THRESHOLD) -> States:
    grads = optim = 0
    for partition in zero3_subgroups(shape, world):
        grads += partition * dt.grad
        optim += partition * dt.master + optimizer_state(optimizer, (partition,), dt.state)
    if not shape.exact:
        return States(math.ceil(shape.parameters / world) * dt.param, grads, optim)
    params = 0
    for t in shape.tensors:
        partition = math.ceil(t.numel / world)
        params += partition * dt.param
        if t.numel <= persistence_threshold:  # kept gathered: the all-gather output, padded to N partitions
            params += partition * world * dt.param
    return States(params, grads, optim)
