"""The library defaults the plan's buffers and layouts are built on still hold in the installed libraries."""

from __future__ import annotations

import inspect

import pytest

from accelkit.plan import buffers, states


@pytest.mark.slow  # imports DeepSpeed (seconds)
def test_deepspeed_zero_defaults() -> None:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    below3, stage3 = DeepSpeedZeroConfig(stage=2), DeepSpeedZeroConfig(stage=3)
    assert below3.reduce_bucket_size == buffers.ZERO_REDUCE_BUCKET
    assert below3.overlap_comm is buffers.ZERO_OVERLAP_COMM_BELOW_3 and stage3.overlap_comm is True
    assert below3.contiguous_gradients is True  # what makes ZeRO allocate its reduce bucket
    assert stage3.prefetch_bucket_size == buffers.ZERO3_PREFETCH_BUCKET
    assert stage3.max_live_parameters == buffers.ZERO3_MAX_LIVE_PARAMETERS
    assert stage3.param_persistence_threshold == states.PERSISTENCE_THRESHOLD
    assert stage3.sub_group_size == states.SUB_GROUP_SIZE
    assert below3.parameter_alignment is False  # no per-parameter padding in the flat buffers


@pytest.mark.slow
def test_deepspeed_alignment_factor() -> None:
    from deepspeed.runtime.zero import stage_1_and_2

    assert f"nccl_start_alignment_factor = {states.ZERO_ALIGNMENT_FACTOR}" in inspect.getsource(stage_1_and_2)


def test_accelerate_ddp_defaults() -> None:
    from accelerate.utils import DistributedDataParallelKwargs

    kwargs = DistributedDataParallelKwargs()
    assert kwargs.gradient_as_bucket_view is buffers.DDP_GRADIENT_AS_BUCKET_VIEW and kwargs.bucket_cap_mb == 25


def test_accelerate_fsdp2_carves_embedding_and_tail_units() -> None:
    # accelkit.plan.shape.fsdp2_units mirrors this code path of Accelerate's fsdp2_prepare_model
    from accelerate.utils import fsdp_utils

    source = inspect.getsource(fsdp_utils.fsdp2_prepare_model)
    assert "fully_shard(input_embed" in source and '"reshard_after_forward": False' in source
    assert hasattr(fsdp_utils, "_find_final_norm")


def test_accelerate_fsdp2_mixed_precision_policy() -> None:
    from accelerate.utils import FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(fsdp_version=2)
    plugin.set_mixed_precision("bf16")
    policy = plugin.mixed_precision_policy
    import torch

    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype) == (torch.bfloat16,) * 3
