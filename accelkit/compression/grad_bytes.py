"""The gradient bytes one step sends, computed from the parameter shapes (what the counted collectives must equal).

Bytes follow accelkit.bench.comm_count (nccl-tests' `size`: the full buffer of each collective), fp32 gradients:

    none      DDP all-reduces every gradient: 4 bytes per element
    fp16/bf16 the hook casts each bucket to 16 bits before the all-reduce: 2 bytes per element
    powersgd  per gradient viewed as an n x m matrix (n = its first dimension), r = min(n, m, rank): if
              (n + m) * r * 2 < n * m (torch's min_compression_rate 2) it sends P (n x r) and Q (m x r), else the
              whole gradient; from the start step on (before it: plain all-reduce)
    fsdp      FSDP2 reduce-scatters each gradient padded to a multiple of the world size along dim 0, in its
              reduce dtype (fp32 4 bytes, bf16/fp16 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from accelkit.compression.compression_spec import CompressionSpec

MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default


def powersgd_elements(shape: Sequence[int], rank: int) -> int:
    """Elements PowerSGD sends for one gradient of `shape` (compressed or not, by torch's rule)."""
    n = int(shape[0]) if shape else 1
    m = math.prod(shape) // n if n else 0
    r = min(n, m, rank)
    compressed = (n + m) * r
    return compressed if compressed * MIN_COMPRESSION_RATE < n * m else n * m


def ddp_bytes_per_step(shapes: Sequence[Sequence[int]], spec: CompressionSpec, step: int) -> int:
    """Bytes DDP's gradient collectives carry at optimizer step `step` (1-based) under `spec`."""
    elements = sum(math.prod(s) for s in shapes)
    if spec.method in ("fp16", "bf16"):
        return 2 * elements
    # PowerSGD's iteration counter counts finished all-reduces: step k runs with iter = k - 1.
    if spec.method == "powersgd" and step - 1 >= spec.powersgd_start_step:
        return 4 * sum(powersgd_elements(s, spec.powersgd_rank) for s in shapes)
    return 4 * elements


def fsdp_reduce_scatter_bytes(shapes: Sequence[Sequence[int]], world: int, reduce_bytes: int) -> int:
    """Bytes of FSDP2's gradient reduce-scatters per step (the input before scattering, padded dim 0)."""
    total = 0
    for s in shapes:
        dim0 = int(s[0]) if s else 1
        padded = math.ceil(dim0 / world) * world
        total += padded * (math.prod(s) // dim0 if dim0 else 0)
    return total * reduce_bytes


def traffic_factor(spec: CompressionSpec | None, shapes: Sequence[Sequence[int]] = ()) -> float:
    """The fraction of the uncompressed fp32 gradient bytes a method sends (for `accelkit plan`): PowerSGD's from
    the given matrix shapes (1.0 without them), int8 (ZeRO++) a quarter of the gradient and weight traffic."""
    if spec is None or not spec.active:
        return 1.0
    if spec.method in ("fp16", "bf16"):
        return 0.5
    if spec.method == "int8":
        return 0.25
    elements = sum(math.prod(s) for s in shapes)
    if not elements:
        return 1.0
    return sum(powersgd_elements(s, spec.powersgd_rank) for s in shapes) / elements
