"""Collective bandwidth with the conventions of NVIDIA's nccl-tests, so figures compare with what cluster admins
publish, and the communication time a step should take from them. Pure arithmetic (no torch).

- size: the bytes of the full buffer: all-reduce in = out = size; all-gather out = size (each rank contributes
  size / N); reduce-scatter in = size (each rank keeps size / N).
- time: the mean over timed iterations, averaged across ranks (nccl-tests' default `-a 1`).
- algbw = size / time (GB = 1e9 bytes); busbw = algbw x 2(N-1)/N for all-reduce, x (N-1)/N for all-gather and
  reduce-scatter: the bandwidth each link sustains, comparable across world sizes.
- a ring all-reduce of D gradient bytes takes 2(N-1)/N x D / busbw; FSDP full sharding and ZeRO-3 move 1.5x
  that per step (a parameter all-gather in forward and in backward, a gradient reduce-scatter), ZeRO-1/2 the same
  as all-reduce (reduce-scatter + all-gather). DDP sends gradients in buckets (25 MiB by default), so the
  bandwidth used is the one measured at the size nearest min(D, 25 MiB).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter")
DDP_BUCKET_BYTES = 25 * 1024 * 1024
GPU_SIZES = ("1K", "256M")
CPU_SIZES = ("4K", "16M")
SIZE_FACTOR = 4  # consecutive sizes differ by this factor (nccl-tests -f)



def parse_message_size(text: str) -> int:
    """`64K`, `16M`, `1G`, `4096` -> bytes: a bare letter is binary, like nccl-tests' -b/-e; `1GB` is 10^9 and
    `1GiB` 2^30, as in every other command (accelkit.sizes)."""
    from accelkit.limits import MAX_MESSAGE_BYTES
    from accelkit.sizes import parse_bytes

    size = parse_bytes(text, "--comm-sizes", bare_number=True, binary_letters=True)
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"{text.strip()} is more than any GPU holds (the limit is 1T per message)")
    return size


def size_range(low: int, high: int, factor: int = SIZE_FACTOR) -> list[int]:
    if low <= 0 or high < low:
        raise ValueError("sizes must be positive, the smallest first")
    sizes, size = [], low
    while size <= high:
        sizes.append(size)
        size *= factor
    return sizes


def fit_size(size: int, num_processes: int, element_size: int = 4) -> int:
    """The largest size <= `size` that splits evenly into N chunks of whole elements (at least one each)."""
    unit = num_processes * element_size
    return max(unit, size // unit * unit)


def bus_factor(op: str, num_processes: int) -> float:
    n = num_processes
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    raise ValueError(f"unknown collective {op!r}")


def algbw_gbs(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def busbw_gbs(op: str, size_bytes: int, seconds: float, num_processes: int) -> float:
    return algbw_gbs(size_bytes, seconds) * bus_factor(op, num_processes)


@dataclass(frozen=True)
class CommRow:
    op: str
    num_processes: int
    size_bytes: int
    count: int  # elements of the full buffer
    dtype: str
    time_us: float
    algbw_gbs: float
    busbw_gbs: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def rows_from_ranks(ranks: Sequence[dict[str, Any]]) -> list[CommRow]:
    """Average every (op, size) time across ranks and derive the bandwidths."""
    if not ranks:
        return []
    n = int(ranks[0]["world_size"])
    rows = []
    for index, first in enumerate(ranks[0]["timings"]):
        seconds = sum(rank["timings"][index]["seconds"] for rank in ranks) / len(ranks)
        op, size = first["op"], int(first["size_bytes"])
        rows.append(CommRow(op=op, num_processes=n, size_bytes=size, count=int(first["count"]),
                            dtype=first["dtype"], time_us=seconds * 1e6, algbw_gbs=algbw_gbs(size, seconds),
                            busbw_gbs=busbw_gbs(op, size, seconds, n)))
    return rows


def comm_volume_factor(backend: str, num_processes: int, zero_stage: int | None = None) -> float:
    """Bytes each rank moves per gradient byte per step: ring all-reduce 2(N-1)/N; FSDP / ZeRO-3 3(N-1)/N."""
    n = num_processes
    if backend == "fsdp" or (backend == "deepspeed" and zero_stage == 3):
        return 3.0 * (n - 1) / n
    return 2.0 * (n - 1) / n


def nearest_all_reduce(rows: Sequence[CommRow], size_bytes: int) -> CommRow | None:
    """The all-reduce row whose size is nearest (on a log scale) to the size DDP sends at once."""
    candidates = [row for row in rows if row.op == "all_reduce" and row.busbw_gbs > 0]
    if not candidates or size_bytes <= 0:
        return None
    target = min(size_bytes, DDP_BUCKET_BYTES)
    return min(candidates, key=lambda row: abs(math.log(row.size_bytes / target)))


def predicted_comm_seconds(gradient_bytes: int, busbw: float, volume_factor: float) -> float:
    """Communication time per step: volume_factor x D / busbw (busbw in GB/s)."""
    return volume_factor * gradient_bytes / (busbw * 1e9)
