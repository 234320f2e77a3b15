"""Whole plans for the cases an ML engineer sizes a cluster for, following the decision tree."""

from __future__ import annotations

from dataclasses import replace

import pytest

from accelkit.errors import AccelkitError
from accelkit.plan import report
from accelkit.plan.estimate import usable_cpu
from accelkit.plan.inputs import Hardware, Training
from accelkit.plan.models import ShapeFlags, spec_from_shape
from accelkit.plan.planner import make_plan
from accelkit.plan.recommend import recommend

GiB = 2**30
LLAMA_7B = ShapeFlags(layers=32, hidden=4096, heads=32, vocab=32000, intermediate=11008)
MODEL_1B = ShapeFlags(layers=24, hidden=2048, heads=16, vocab=32000)


@pytest.fixture(scope="module")
def llama7b():
    return spec_from_shape(LLAMA_7B)


@pytest.fixture(scope="module")
def classic(llama7b):
    return plan_for(llama7b, seq_len=2048)


def plan_for(spec, gpus=4, nodes=1, gpu=24 * GiB, cpu=256 * GiB, **training):
    return make_plan(spec, Hardware(gpus, nodes, gpu, cpu), Training(**training))


def test_the_classic_case_needs_sharding_plus_cpu_offload(classic) -> None:
    """7B Llama-shaped, bf16 mixed, AdamW, 4 x 24 GB: no plain sharding fits, sharding plus CPU offload does."""
    plan = classic
    assert plan.shape.parameters == 6_738_415_616  # built on the meta device: Llama-2-7B's count
    rows = {r.strategy.name: r for r in plan.rows}
    for name in ("single", "ddp", "fsdp-full", "fsdp-grad-op", "zero1", "zero2", "zero3"):
        assert rows[name].fits is False, name
    assert rows["fsdp-hybrid"].unavailable is not None
    assert rows["fsdp-offload"].fits and rows["zero3-offload"].fits
    # fully sharded model states are the paper's 16 bytes per parameter over 4 GPUs, already over the 24 GB
    full = rows["fsdp-full"]
    assert full.states.total == pytest.approx(16 * plan.shape.parameters / 4, rel=1e-4)
    assert full.states.total > full.gpu_usable
    # offloaded, the CPU holds them: 16P per node for FSDP, 18P for ZeRO-3 (DeepSpeed's own estimator's figure)
    assert rows["fsdp-offload"].cpu_per_node == pytest.approx(16 * plan.shape.parameters, rel=1e-4)
    assert rows["zero3-offload"].cpu_per_node == pytest.approx(18 * plan.shape.parameters, rel=1e-3)
    assert plan.recommendation.strategy == "fsdp-offload"
    text = "\n".join(report.text(plan))
    assert "Without offload the smallest option, FSDP full shard" in text and "model states alone" in text
    assert "accelkit config --backend fsdp --num-processes 4 --mixed-precision bf16 --sharding full --offload" in text


def test_the_classic_case_without_enough_cpu_memory_fits_nowhere(classic) -> None:
    rows = [replace(row, cpu_usable=usable_cpu(64 * GiB)) for row in classic.rows]  # the same plan, 64 GiB of RAM
    choice = recommend(rows, gpus=4, nodes=1, prefer="any", checkpointing=False)
    assert choice.strategy is None and "CPU memory is the limit" in choice.reason
    assert "activation checkpointing" not in choice.reason  # the fix named is the real limit
    offload = next(r for r in rows if r.strategy.name == "fsdp-offload")
    assert offload.cpu_fits is False and offload.fits is False


def test_offload_never_fits_when_the_cpu_memory_is_unknown(classic) -> None:
    rows = [replace(row, cpu_usable=None) for row in classic.rows]  # the same plan, CPU memory not given
    offload = next(r for r in rows if r.strategy.name == "fsdp-offload")
    assert offload.gpu_fits is True and offload.cpu_fits is None and offload.fits is False
    choice = recommend(rows, gpus=4, nodes=1, prefer="any", checkpointing=False)
    assert choice.strategy is None and "CPU memory is not known: give --cpu-memory" in choice.reason
    unknown = replace(classic, rows=rows, recommendation=choice)
    lines = report.text(unknown)
    assert any("no (CPU?)" in line and line.startswith("FSDP + CPU offload") for line in lines)
    assert any(line.strip().startswith("no (CPU?): CPU memory not known") for line in lines)
    asked = recommend(rows, gpus=4, nodes=1, prefer="any", checkpointing=False, chosen="fsdp-offload")
    assert "it fits the GPUs" in asked.reason and "CPU memory per machine (not known: give --cpu-memory)" \
        in asked.reason


def test_a_small_model_gets_ddp() -> None:
    plan = plan_for(spec_from_shape(ShapeFlags(layers=2, hidden=256, heads=4, vocab=1000)), gpus=2, seq_len=256)
    assert plan.recommendation.strategy == "ddp"


def test_when_only_the_optimizer_states_do_not_fit_zero2_or_fsdp_grad_op() -> None:
    spec = spec_from_shape(MODEL_1B)
    plan = plan_for(spec, gpu=16 * GiB, seq_len=512)
    assert plan.row("ddp").fits is False
    assert plan.recommendation.strategy == "zero2"
    preferred = make_plan(spec, plan.hardware, plan.training, prefer="fsdp")
    assert preferred.recommendation.strategy == "fsdp-grad-op"


def test_several_machines_prefer_hybrid_sharding_when_a_machine_holds_a_full_shard() -> None:
    plan = plan_for(spec_from_shape(MODEL_1B), gpus=16, nodes=2, gpu=6 * GiB, seq_len=512,
                    activation_checkpointing=True)
    assert plan.row("zero2").fits is False and plan.row("fsdp-hybrid").fits is True
    assert plan.recommendation.strategy == "fsdp-hybrid"
    commands = report.commands(plan)
    assert "--sharding hybrid" in commands.config and "--num-machines 2" in commands.config


def test_impossible_strategies_are_refused_with_the_alternative(llama7b) -> None:
    with pytest.raises(AccelkitError, match="needs --num-machines 2") as caught:
        make_plan(llama7b, Hardware(4, 1, 80 * GiB, None), Training(), strategy="fsdp-hybrid")
    assert "fsdp-full" in caught.value.hint
    with pytest.raises(AccelkitError, match="shards nothing") as caught:
        make_plan(llama7b, Hardware(1, 1, 80 * GiB, None), Training(), strategy="zero2")
    assert "zero3-offload" in caught.value.hint


def test_global_batch_sets_accumulation_and_the_learning_rate_scales_linearly() -> None:
    plan = plan_for(spec_from_shape(MODEL_1B), gpus=8, gpu=80 * GiB, micro_batch=2, global_batch=64, base_lr=3e-4,
                    base_batch=16, seq_len=512)
    chosen = plan.chosen
    assert chosen.accumulation == 4
    lr = plan.learning_rate()
    assert lr.effective_batch == 64 and lr.linear == pytest.approx(1.2e-3)
    text = "\n".join(report.text(plan))
    assert "effective batch 64 = micro-batch 2 x 8 data-parallel rank(s) x 4 accumulation step(s)" in text
    assert "warm it up linearly" in text


def test_a_global_batch_that_does_not_divide_is_refused_with_the_nearest_ones(llama7b) -> None:
    with pytest.raises(AccelkitError, match="accumulation would be 2.5") as caught:
        plan_for(llama7b, micro_batch=2, global_batch=20)
    assert "--global-batch 16 or 24" in caught.value.hint


def test_activation_checkpointing_shrinks_activations_to_layer_inputs_plus_one_layer() -> None:
    spec = spec_from_shape(ShapeFlags(layers=8, hidden=4096, heads=32, vocab=32000))
    plain = plan_for(spec, seq_len=4096)
    ckpt = plan_for(spec, seq_len=4096, activation_checkpointing=True)
    full, saved = plain.row("fsdp-full").activations, ckpt.row("fsdp-full").activations
    layer_inputs = 8 * 4096 * 4096 * 2  # each layer's bf16 input, kept to recompute it
    assert saved < full / 3 and saved > layer_inputs


def test_json_has_the_names_the_issue_lists_with_integer_bytes(classic) -> None:
    data = report.to_json(classic)
    assert isinstance(data["model"]["parameters"], int)
    for row in data["strategies"]:
        assert set(row["per_gpu_bytes"]) >= {"parameters", "gradients", "optimizer", "activations", "buffers",
                                             "total"}
        assert all(isinstance(v, int) for v in row["per_gpu_bytes"].values())
        assert isinstance(row["cpu_bytes_per_node"], int) and row["fits"] in (True, False)
        assert isinstance(row["name"], str)
    rec = data["recommendation"]
    assert rec["strategy"] == "fsdp-offload" and rec["reason"] and rec["command"].startswith("accelkit config")


def test_the_docs_show_the_classic_case_as_it_is(llama7b) -> None:
    """The guide shows the command's output: nothing fits on the GPUs alone, so the command plans with activation
    checkpointing (the cheaper remedy it tries first) and still recommends offload."""
    from helpers import REPO_ROOT

    guide = (REPO_ROOT / "docs" / "guides" / "memory-planning.md").read_text()
    for line in report.table(plan_for(llama7b, seq_len=2048, activation_checkpointing=True)):
        assert line in guide, line


def test_a_forward_that_cannot_run_on_meta_falls_back_and_says_so() -> None:
    import torch

    from accelkit.plan.models import ModelSpec

    class DataDependent(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(8, 8)

        def forward(self, x):
            if x.sum() > 0:  # needs the data: impossible on meta tensors
                x = x * 2
            return self.linear(x)

    spec = ModelSpec(label="custom", build=DataDependent, step=lambda m, batch: (m(**batch).sum(), None),
                     inputs=lambda m, b, s: {"x": torch.zeros(b, 8, device="meta")})
    plan = plan_for(spec, gpus=2, gpu=8 * GiB)
    assert plan.activations["torch"].bytes is None
    assert plan.activations["torch"].source.startswith("not modelled (tracing failed:")
    llama = spec_from_shape(ShapeFlags(layers=2, hidden=256, heads=4, vocab=1000))
    llama.step = spec.step  # a Llama whose step fails on meta: the formula steps in, from its config
    fallback = plan_for(llama, gpus=2, gpu=8 * GiB, seq_len=128).activations["torch"]
    assert fallback.bytes > 0 and fallback.source.startswith("Korthikanti et al. formula (tracing failed:")
