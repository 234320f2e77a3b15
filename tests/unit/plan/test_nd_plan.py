"""N-D rows of the plan (issue 22, item 3): the 70B Llama on 4 machines x 8 x 80 GB, the TP plan's split, the
sequence split of CP/SP, HSDP, and TP across machines refused."""

from __future__ import annotations

import pytest

from accelkit.configs.mesh import Mesh
from accelkit.plan import nd

LLAMA_70B = nd.Model.llama(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, intermediate=28672)
CLUSTER = {"gpus": 32, "nodes": 4, "gpu_memory": 80 * 10**9}


def test_70b_shapes_match_the_model():
    assert LLAMA_70B.parameters == 70_553_706_496  # LlamaForCausalLM built on the meta device has this many


def test_70b_at_8k_tokens_data_parallel_sharding_alone_fits_and_is_recommended():
    advice = nd.advise(LLAMA_70B, seq_len=8192, **CLUSTER)
    assert advice.best is not None and advice.best.layout == nd.Layout("fsdp", Mesh(dp_shard=32))
    assert "data-parallel sharding alone fits" in advice.reason
    assert advice.commands[0].startswith("accelkit config --backend fsdp --dp-shard-size 32 --num-machines 4")


def test_70b_at_128k_tokens_needs_the_sequence_split_with_commands():
    advice = nd.advise(LLAMA_70B, seq_len=131072, **CLUSTER)
    no_split = [r for r in advice.rows if r.layout.sequence_split == 1 and r.unavailable is None]
    assert no_split and not any(r.fits for r in no_split)  # data parallelism and TP alone: nothing fits
    best = advice.best.layout
    assert best.mesh.cp > 1 or best.mesh.sp > 1
    assert "splitting the sequence" in advice.reason
    size = f"--cp-size {best.mesh.cp}" if best.mesh.cp > 1 else f"--sp-size {best.mesh.sp}"
    assert all(size in command for command in advice.commands)
    assert advice.commands[1].startswith("accelkit launch ")
    # The split's activations are the sequence's share: cp 8 holds 1/8 of the no-split activations.
    full = advice.rows[0].activations
    cp8 = next(r for r in advice.rows if r.layout.mesh.cp == 8)
    assert cp8.activations == pytest.approx(full / 8, rel=1e-6)


def test_tp_across_machines_is_refused():
    row = nd.row(nd.Layout("fsdp", Mesh(dp_shard=2, tp=16)), LLAMA_70B, seq_len=8192, **CLUSTER)
    assert row.fits is False and "would span machines" in row.unavailable
    assert all(r.layout.mesh.tp * r.layout.mesh.cp <= 8 for r in nd.advise(LLAMA_70B, seq_len=131072, **CLUSTER).rows
               if r.unavailable is None)


def test_tp_plan_splits_the_planned_weights_and_replicates_the_rest():
    row = nd.row(nd.Layout("fsdp", Mesh(dp_shard=16, tp=2)), LLAMA_70B, seq_len=8192, **CLUSTER)
    norms = 8192 * (2 * 80 + 1)
    assert row.tp_replicated == norms  # the norms are not in the plan; transformers 5.x splits the embedding too
    assert row.tp_sharded == LLAMA_70B.parameters - norms
    plain = nd.row(nd.Layout("fsdp", Mesh(dp_shard=32)), LLAMA_70B, seq_len=8192, **CLUSTER)
    # Each rank holds 1/32 of the split weights either way; the replicated norms cost tp times more.
    assert row.states - plain.states == norms * 16 * (1 / 16 - 1 / 32)


def test_tp_alone_keeps_the_embedding_gradient_whole_as_measured():
    tiny = nd.Model.llama(layers=2, hidden=32, heads=4, kv_heads=2, vocab=64, intermediate=64)
    row = nd.row(nd.Layout("ddp", Mesh(tp=2)), tiny, gpus=2, nodes=1, gpu_memory=None, seq_len=16)
    assert row.states == 45696 + 49792 + 91392  # rank 0's parameters, gradients, moments in the TP 2 rehearsal


def test_sequence_parallelism_in_tp_splits_the_rest_of_the_activations():
    without = nd.row(nd.Layout("fsdp", Mesh(dp_shard=8, tp=4)), LLAMA_70B, seq_len=8192, **CLUSTER)
    with_sp = nd.row(nd.Layout("fsdp", Mesh(dp_shard=8, tp=4), sequence_parallel=True), LLAMA_70B, seq_len=8192,
                     **CLUSTER)
    assert with_sp.activations < without.activations
    assert without.traffic["tp"] > 0 and "dp_shard_cp" in without.traffic


def test_hsdp_keeps_a_shard_per_machine_and_all_reduces_across():
    hsdp = nd.row(nd.Layout("fsdp", Mesh(dp_replicate=4, dp_shard=8)), LLAMA_70B, seq_len=8192, **CLUSTER)
    full = nd.row(nd.Layout("fsdp", Mesh(dp_shard=32)), LLAMA_70B, seq_len=8192, **CLUSTER)
    assert hsdp.states == pytest.approx(4 * full.states, rel=1e-4)
    assert hsdp.traffic["dp_replicate"] > 0


def test_nothing_fits_names_the_smallest_layout():
    advice = nd.advise(LLAMA_70B, gpus=8, nodes=1, gpu_memory=24 * 10**9, seq_len=131072)
    assert advice.best is None and "no layout fits" in advice.reason and "needs" in advice.reason


@pytest.mark.parametrize("seq_len", [8192, 131072])
def test_recommended_commands_pass_the_config_rules(seq_len, monkeypatch):
    """The plan's commands are ones `accelkit config` accepts (the one rule set), version checks aside."""
    from accelkit.configs import ConfigOptions, compat, machine_defaults
    from accelkit.configs.resolve import resolve_config

    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)
    monkeypatch.setattr(compat, "gaps", lambda **_: iter(()))
    advice = nd.advise(LLAMA_70B, seq_len=seq_len, precision="bf16", **CLUSTER)
    words = advice.commands[0].split()[2:-2]
    assert "--mixed-precision" in words  # the job as planned: its precision, and its checkpointing
    if advice.best.layout.backend == "fsdp":
        assert "--activation-checkpointing" in words
    else:
        assert "gradient_checkpointing_enable()" in advice.reason
    given = {}
    while words:
        name = words.pop(0)[2:].replace("-", "_")
        if not words or words[0].startswith("--"):
            given[name] = True
            continue
        value = words.pop(0)
        given[name] = value if name in ("backend", "main_process_ip", "mixed_precision") else int(value)
    config = resolve_config(ConfigOptions(**given))
    assert config.parallelism is not None and config.parallelism.total in (32, config.parallelism.sp)
