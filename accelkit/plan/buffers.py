"""Temporary buffers per GPU: the gather and bucket sizes each backend really uses, each with its source.

Defaults are those of the configs accelkit writes (no bucket keys, so the libraries' own defaults apply), read from
the installed libraries (tests/unit/plan/test_defaults.py checks they still hold):
- DDP (torch DistributedDataParallel through Accelerate's DistributedDataParallelKwargs): bucket_cap_mb=25 and
  gradient_as_bucket_view=False, so the reducer's buckets are a second, flat copy of every gradient.
- autocast (Accelerate's mixed precision for one device and DDP): the forward casts every fp32 weight a matmul uses
  to 16 bits and keeps the copy (autocast's cache, saved for the backward) until the backward is done.
- FSDP2 (Accelerate 1.15's fsdp2_prepare_model): a unit's parameters are all-gathered in the compute dtype; the
  root and the tail (final norm + output embedding) stay gathered from their forward to their backward, layers are
  freed after their forward with full shard (the current and the prefetched next one are gathered), and all stay
  gathered with grad-op. A unit's unsharded gradients plus the reduce-scatter input are live while it reduces.
  Under gradient accumulation Accelerate turns gradient sync off (`set_requires_gradient_sync(False)`), so every
  unit's unsharded gradient is kept until the last micro-batch.
- DeepSpeed ZeRO (0.19, zero/config.py): reduce_bucket_size=5e8 elements, one 16-bit buffer (two with
  overlap_comm, which defaults to true only at stage 3, where the stage keeps a single bucket); stage 3 gathers the
  module running plus a prefetch bucket of stage3_prefetch_bucket_size=5e7 elements (capped by
  stage3_max_live_parameters=1e9); at the step ZeRO converts its 16-bit gradient partition to an fp32 one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from accelkit.plan import states
from accelkit.plan.catalog import Strategy
from accelkit.plan.shape import ModelShape
from accelkit.plan.states import Dtypes

DDP_GRADIENT_AS_BUCKET_VIEW = False  # accelerate.utils.DistributedDataParallelKwargs
ZERO_REDUCE_BUCKET = 500_000_000  # deepspeed zero_optimization.reduce_bucket_size (elements)
ZERO_OVERLAP_COMM_BELOW_3 = False  # deepspeed zero_optimization.overlap_comm: true only for stage 3
ZERO3_PREFETCH_BUCKET = 50_000_000  # deepspeed zero_optimization.stage3_prefetch_bucket_size (elements)
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000  # deepspeed zero_optimization.stage3_max_live_parameters (elements)


@dataclass(frozen=True)
class Part:
    what: str
    bytes: int
    source: str


def unit_sizes(shape: ModelShape, shard_world: int) -> list[tuple[int, bool, str]]:
    """(gathered elements, resharded after forward, name) per FSDP2 unit: dim-0 chunks are padded to N rows."""
    out = []
    for unit in shape.units:
        elements = 0
        for index in unit.params:
            t = shape.tensors[index]
            rows, rest = (t.shape[0], math.prod(t.shape[1:])) if t.shape else (1, 1)
            elements += math.ceil(rows / shard_world) * shard_world * rest
        out.append((elements, unit.reshard_after_forward, unit.name))
    return out


def torch_parts(strategy: Strategy, shape: ModelShape, dt: Dtypes, weight_copies: int) -> list[Part]:
    parts = []
    if weight_copies:
        parts.append(Part("autocast copies of the weights", weight_copies,
                          "autocast caches each fp32 weight's 16-bit cast until the backward"))
    if strategy.distributed and not DDP_GRADIENT_AS_BUCKET_VIEW:
        parts.append(Part("DDP gradient buckets", shape.trainable * dt.grad,
                          "DDP reducer buckets (bucket_cap_mb=25) copy every gradient: Accelerate's default "
                          "gradient_as_bucket_view=False"))
    return parts


def fsdp_parts(strategy: Strategy, shape: ModelShape, compute_bytes: int, shard_world: int,
               accumulation: int) -> list[Part]:
    if not shape.units:
        return [Part("all-gathered parameters (no unit shapes: model count only)", 0, "not modelled")]
    units = unit_sizes(shape, shard_world)
    kept = sum(e for e, reshard, _ in units if not reshard)
    resharded = sorted((e for e, reshard, _ in units if reshard), reverse=True)
    if strategy.sharding == "grad-op":
        gathered = sum(e for e, _, _ in units)
        how = "grad-op keeps every unit gathered from its forward to its backward"
    else:
        gathered = kept + sum(resharded[:2])
        how = "root and tail units kept from forward to backward, plus the current and prefetched layer"
    largest = max(e for e, _, _ in units)
    parts = [Part("all-gathered parameters", gathered * compute_bytes, f"FSDP2 units as Accelerate builds them: {how}"),
             Part("unsharded gradients of the reducing unit", 2 * largest * compute_bytes,
                  "the largest unit's full gradient and its reduce-scatter input")]
    if accumulation > 1:
        parts.append(Part("unsharded gradients kept across accumulation", sum(e for e, _, _ in units) * compute_bytes,
                          "Accelerate's accumulate() turns FSDP2 gradient sync off until the last micro-batch"))
    return parts


def zero_parts(strategy: Strategy, shape: ModelShape, dt: Dtypes, world: int) -> list[Part]:
    stage = strategy.zero_stage
    buffers = 2 if stage < 3 and ZERO_OVERLAP_COMM_BELOW_3 else 1
    parts = [Part("reduce bucket", buffers * ZERO_REDUCE_BUCKET * dt.grad,
                  f"reduce_bucket_size={ZERO_REDUCE_BUCKET:.0e} elements (DeepSpeed default), allocated whole "
                  "whatever the model size")]
    if stage == 3:
        largest, unit = max(states.zero3_subgroups(shape, world)), "sub-group (sub_group_size=1e9)"
    else:
        largest, unit = max(states.zero12_partition_sizes(shape, world)), "optimizer group"
    parts.append(Part("fp32 gradient partition during the step", largest * 4,
                      f"ZeRO converts one {unit}'s 16-bit gradient partition to fp32 at a time for the step"))
    if stage == 3:
        gathered = min(shape.largest_module + ZERO3_PREFETCH_BUCKET, ZERO3_MAX_LIVE_PARAMETERS, shape.parameters)
        parts.append(Part("gathered parameters", gathered * dt.param,
                          "the largest module plus stage3_prefetch_bucket_size=5e7 elements, at most "
                          "stage3_max_live_parameters=1e9"))
        parts.append(Part("gradients of the module being reduced", shape.largest_module * dt.grad,
                          "a module's full gradients before they enter the reduce bucket"))
    return parts
