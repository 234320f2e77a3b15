"""Known failures from inside a rank become one line naming the cause and the way out; the errors are the real
ones torch raises, made here in one process."""

from __future__ import annotations

import pytest
import torch

from accelkit.ranks.explain import explain
from accelkit.rehearsal.shim import REHEARSAL_ENV


class WithScale(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.scale = torch.nn.Parameter(torch.tensor(2.0))  # 0-dim, as in Accelerate's test_script.py


@pytest.fixture
def one_rank_group():
    import torch.distributed as dist

    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_fsdp2_scalar_parameter_is_named_with_the_ways_out(one_rank_group):
    from torch.distributed.fsdp import fully_shard

    with pytest.raises(ValueError) as raised:
        fully_shard(WithScale())
    error = explain(raised.value)
    assert error is not None
    assert error.message == "the model's parameter `scale` is 0-dim (a scalar), which FSDP2 (fully_shard) cannot shard"
    assert "shape (1,)" in error.hint and "--backend ddp" in error.hint


def test_fsdp1_refuses_scalars_too(one_rank_group):
    from torch.distributed.fsdp import FullyShardedDataParallel

    with pytest.raises(ValueError) as raised:
        FullyShardedDataParallel(WithScale(), device_id=torch.device("cpu"))
    error = explain(raised.value)
    assert error is not None and "`scale`" in error.message and "FSDP1" in error.message


def test_deepspeed_scalar_parameter_is_found_in_the_failing_frames():
    def flatten_for_partition(engine_module):  # where DeepSpeed's ZeRO views each parameter as bytes
        return [p.view(torch.uint8) for p in engine_module.parameters()]

    with pytest.raises(RuntimeError) as raised:
        flatten_for_partition(WithScale())
    assert "self.dim() cannot be 0 to view" in str(raised.value)  # the real torch message DeepSpeed hits
    error = explain(raised.value)
    assert error is not None and "`scale`" in error.message and "DeepSpeed ZeRO" in error.message


def test_hard_coded_cuda_tensor_in_a_rehearsal_names_the_line(monkeypatch):
    monkeypatch.setenv(REHEARSAL_ENV, "ddp")
    with pytest.raises((AssertionError, RuntimeError)) as raised:
        torch.zeros(3, device="cuda")
    error = explain(raised.value)
    assert error is not None
    assert "test_explain.py:" in error.message and 'torch.zeros(3, device="cuda")' in error.message
    assert "accelerator.device" in error.hint


def test_cuda_errors_outside_a_rehearsal_are_left_alone(monkeypatch):
    monkeypatch.delenv(REHEARSAL_ENV, raising=False)
    with pytest.raises((AssertionError, RuntimeError)) as raised:
        torch.zeros(3, device="cuda")
    assert explain(raised.value) is None


@pytest.mark.parametrize(("launched", "options", "message"), [
    ("2", {"sharding_strategy": "FULL_SHARD"}, "an FSDP1-style FullyShardedDataParallelPlugin (sharding_strategy), but "
                                                "the launch config says fsdp_version 2"),
    ("1", {"reshard_after_forward": True},
     "an FSDP2-style FullyShardedDataParallelPlugin (reshard_after_forward=True/False), but the launch config says "
     "fsdp_version 1"),
])
def test_plugin_of_the_other_fsdp_version(monkeypatch, launched, options, message):
    # Accelerate's test_merge_weights.py builds FullyShardedDataParallelPlugin(sharding_strategy=...) itself.
    from accelerate import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_VERSION", launched)  # what `accelerate launch` exports from the config
    with pytest.raises(ValueError) as raised:
        FullyShardedDataParallelPlugin(**options)
    error = explain(raised.value)
    assert error is not None
    assert error.message == f"{__file__}:{raised.traceback[0].lineno + 1} builds {message}"
    assert error.hint.startswith(f"launch with --fsdp-version {'1' if launched == '2' else '2'}")


def test_collective_mismatch_found_by_torch_debug_detail():
    text = ("Detected mismatch between collectives on ranks. Rank 0 is running collective: CollectiveFingerPrint("
            "SequenceNumber=3, OpType=ALLREDUCE, TensorShape=[10], TensorDtypes=Float, TensorDeviceTypes=cpu), but "
            "Rank 1 is running collective: CollectiveFingerPrint(SequenceNumber=3, OpType=BARRIER).")
    error = explain(RuntimeError(text))
    assert error is not None and error.message.startswith("ranks called different collectives: rank 0 allreduce, "
                                                           "rank 1 barrier")


def test_unknown_errors_pass_through():
    assert explain(ValueError("user bug")) is None
    assert explain(KeyError("x")) is None


# -- tensor parallelism (issue 32 item 2); the real multi-rank errors: tests/faults/test_trust_faults.py -----------
def _attention_view(config, shape: tuple[int, ...], size: int) -> RuntimeError:
    """The reshape transformers' attention does on a rank's q/k/v slice, raised from a module holding `config`."""

    class Attention:
        def __init__(self) -> None:
            self.config = config

        def forward(self) -> None:
            torch.zeros(size).view(*shape)

    try:
        Attention().forward()
    except RuntimeError as exc:
        return exc
    raise AssertionError("the view should fail")


def test_tp_splitting_heads_names_the_heads_and_the_sizes_that_fit(monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "4")
    exc = _attention_view(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), (8, 64, -1, 16), 4096 + 8)
    error = explain(exc)
    assert error is not None
    assert "tp_size 4 does not split the model's 4 attention heads and 2 kv heads" in error.message
    assert "divides both (2)" in error.hint


def test_a_reshape_error_without_tensor_parallelism_is_not_explained(monkeypatch) -> None:
    from types import SimpleNamespace

    monkeypatch.delenv("PARALLELISM_CONFIG_TP_SIZE", raising=False)
    exc = _attention_view(SimpleNamespace(num_attention_heads=4, num_key_value_heads=2), (8, 64, -1, 16), 4096 + 8)
    assert explain(exc) is None
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")  # heads that split: the error is something else
    assert explain(exc) is None


def test_invalid_storage_outside_a_save_is_not_explained() -> None:
    assert explain(RuntimeError("Attempted to access the data pointer on an invalid python storage.")) is None


def test_distributed_config_smaller_than_the_world_under_fsdp2_x_tp_says_to_load_whole(monkeypatch, one_rank_group):
    """transformers' own refusal (its DistributedConfig mesh must cover every process), raised for real: tp 2 asked
    of a 1-process world stands for tp 2 inside 4 processes. Without tensor parallelism it is left alone."""
    from transformers.distributed import DistributedConfig
    from transformers.distributed.utils import initialize_distributed_mesh

    with pytest.raises(RuntimeError) as raised:
        initialize_distributed_mesh(DistributedConfig(tp_size=2))
    assert str(raised.value) == "The parallel mesh requires 2 processes, but world_size is 1."  # the words matched
    monkeypatch.setenv("PARALLELISM_CONFIG_TP_SIZE", "2")
    assert explain(raised.value) is None  # the mesh asked more than the world: not this mistake
    too_small = RuntimeError("The parallel mesh requires 2 processes, but world_size is 4.")
    error = explain(too_small)
    assert error is not None and "\n" not in error.message
    assert error.message.endswith("transformers' DistributedConfig builds its mesh over all 4 processes, but it was "
                                  "given 2 (tp 2); the other processes are Accelerate's data-parallel ranks")
    assert "from_pretrained without distributed_config" in error.hint
    monkeypatch.delenv("PARALLELISM_CONFIG_TP_SIZE")
    assert explain(too_small) is None
