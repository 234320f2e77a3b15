"""Model states per rank agree with the ZeRO paper's accounting where the stack really behaves that way, and differ
where it does not (the measured truth is in tests/integration/test_plan_measured.py)."""

from __future__ import annotations

import pytest
import torch

from accelkit.plan import states
from accelkit.plan.shape import ModelShape, ParamTensor

N = 4
BIG = tuple(ParamTensor(f"layer{i}.weight", (1024, 1024)) for i in range(8))  # no persistence, even partitions
P = 8 * 1024 * 1024
STEPS = 4  # AdamW's float32 step scalar per tensor (per flat partition under ZeRO)


def shape(tensors=BIG, groups=None) -> ModelShape:
    return ModelShape("m", "test", sum(t.numel for t in tensors), tensors,
                      groups=groups or (tuple(range(len(tensors))),))


def test_ddp_mixed_is_16_bytes_per_parameter_made_of_fp32_weights_and_grads() -> None:
    # The paper: 2 (bf16 weights) + 2 (bf16 grads) + 12 (fp32 master + moments). Accelerate's autocast keeps fp32
    # weights and grads and the moments: 4 + 4 + 8 = the same 16 bytes, distributed differently.
    held = states.replicated(shape(), states.dtypes_for("torch", "bf16-mixed"), "adamw")
    assert (held.parameters, held.gradients, held.optimizer) == (4 * P, 4 * P, 8 * P + 8 * STEPS)


@pytest.mark.parametrize("stage, paper", [(1, 4 * P + 12 * P // N), (2, 2 * P + 14 * P // N), (3, 16 * P // N)])
def test_zero_stages_match_the_paper(stage: int, paper: int) -> None:
    dt = states.dtypes_for("deepspeed", "bf16-mixed")
    held = states.zero3(shape(), dt, "adamw", N) if stage == 3 else states.zero12(shape(), dt, "adamw", N, 0, stage)
    assert held.total - STEPS == paper


def test_fsdp2_full_shard_is_16_bytes_over_n() -> None:
    held = states.fsdp2(shape(), states.dtypes_for("fsdp", "bf16-mixed"), "adamw", N, 0)
    assert held.total - 8 * STEPS == 16 * P // N


def test_deepspeed_keeps_an_fp32_master_copy_even_in_fp32() -> None:
    fp32 = states.zero12(shape(), states.dtypes_for("deepspeed", "fp32"), "adamw", N, 0, 2)
    assert fp32.optimizer == P // N * 4 + 2 * P // N * 4 + STEPS  # master + two moments, where DDP has moments only


@pytest.mark.parametrize("rows", [5, 258, 7, 1])
def test_fsdp2_pads_every_rank_to_the_first_chunk_and_the_optimizer_follows_the_real_chunk(rows: int) -> None:
    t = ParamTensor("w", (rows, 3))
    chunks = torch.chunk(torch.empty(rows, 3), N, dim=0)  # what fully_shard splits with
    for rank in range(N):
        held = states.fsdp2(shape((t,)), states.dtypes_for("fsdp", "fp32"), "adamw", N, rank)
        mine = chunks[rank].shape[0] if rank < len(chunks) else 0
        assert held.parameters == chunks[0].shape[0] * 3 * 4  # the padded buffer, on every rank
        assert held.optimizer == 2 * mine * 3 * 4 + STEPS


def test_zero2_last_rank_also_holds_the_padding_and_boundary_params_count_whole() -> None:
    tensors = (ParamTensor("a", (10,)), ParamTensor("b", (7,)))  # 17 elements, aligned to 2N = 8 -> 24
    dt = states.dtypes_for("deepspeed", "bf16-mixed")
    grads = [states.zero12(shape(tensors), dt, "sgd", N, r, 2).gradients // 2 for r in range(N)]
    # partitions of 6: [0,6) touches a; [6,12) touches a and b; [12,18) touches b; [18,24) is padding (7 zeros)
    assert grads == [10, 17, 7, 7]


def test_zero3_small_parameters_stay_gathered() -> None:
    small = (ParamTensor("norm", (6,)),)
    held = states.zero3(shape(small), states.dtypes_for("deepspeed", "bf16-mixed"), "sgd", N)
    assert held.parameters == 2 * 2 + 8 * 2  # its partition (ceil(6/4) = 2) and the gathered, padded copy (8)


def test_a_factored_optimizer_loses_its_factoring_on_zero_partitions() -> None:
    factored = states.replicated(shape(), states.dtypes_for("torch", "fp32"), "adafactor")
    flat = states.zero3(shape(), states.dtypes_for("deepspeed", "fp32"), "adafactor", 1)
    assert factored.optimizer == 8 * (2 * 1024 * 4 + STEPS)  # row and column factors per matrix
    assert flat.optimizer == P * 4 + P * 4 + STEPS  # fp32 master + a full second moment of the 1-D partition


def test_zero3_sub_groups_split_each_group_by_partition_size() -> None:
    assert states.zero3_subgroups(shape(), N, sub_group_size=P // N // 2) == [P // N // 2, P // N // 2]
    assert states.zero3_subgroups(shape(), N) == [P // N]
