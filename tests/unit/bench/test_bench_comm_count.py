"""The collective counter of one step: bytes in nccl-tests' convention, by collective and group size, for the ops
DDP, FSDP2 and DTensor issue (their dispatcher names)."""

from __future__ import annotations

import torch

from accelkit.bench.comm_count import CommCounter, collective_bytes, collective_family


def test_families() -> None:
    assert collective_family("allreduce_") == collective_family("all_reduce") == "all_reduce"
    assert collective_family("_allgather_base_") == collective_family("all_gather_into_tensor") == "all_gather"
    assert collective_family("_reduce_scatter_base_") == collective_family("reduce_scatter_tensor") == "reduce_scatter"
    assert collective_family("broadcast_") == "broadcast"


def test_the_full_buffer_is_counted() -> None:
    full, shard = torch.zeros(8), torch.zeros(2)
    assert collective_bytes("allreduce_", ([full],), {}) == 32
    assert collective_bytes("_allgather_base_", (full, shard), {}) == 32  # output: the gathered buffer
    assert collective_bytes("_reduce_scatter_base_", (shard, full), {}) == 32  # input: before scattering
    assert collective_bytes("all_gather_into_tensor", (shard, 4, "group"), {}) == 32  # functional: shard x group


def test_only_collectives_are_counted() -> None:
    counter = CommCounter()
    counter.add("wrap_tensor_autograd", (torch.zeros(4),), {})
    counter.add("wait_tensor", (torch.zeros(4),), {})
    counter.add("allreduce_", ([torch.zeros(4)],), {})
    counter.add("allreduce_", ([torch.zeros(4)],), {})
    assert counter.stop() == {"all_reduce": {"calls": 2, "bytes": 32}}
