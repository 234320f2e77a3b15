"""Pipeline rows of the plan (issue 34, item 5): stages, in-flight micro-batches per schedule, the bubble, point-to-
point bytes, per-stage model states, and the published runs checked on paper (torchtitan's Llama 3.1 405B on 512
H100, GPT-3 175B's 64 x 8 x 8)."""

from __future__ import annotations

import pytest

from accelkit.configs.mesh import Mesh
from accelkit.errors import AccelkitError
from accelkit.plan import nd
from accelkit.plan.activations.profile import Profile
from accelkit.plan.pipeline import Pipeline, check_pipeline, schedule_name

LLAMA_70B = nd.Model.llama(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, intermediate=28672)
GiB = 2**30


def test_bubble_follows_the_schedules_formulas():
    assert Pipeline(8, "1F1B", 32).bubble == pytest.approx(7 / 39)
    assert Pipeline(8, "GPipe", 32).bubble == pytest.approx(7 / 39)
    assert Pipeline(8, "Interleaved1F1B", 32).bubble == pytest.approx(7 / 64)  # (p-1)/(v*m), v = 2
    assert Pipeline(1).bubble == 0


def test_in_flight_micro_batches_differ_by_schedule():
    gpipe, one_f_one_b = Pipeline(4, "GPipe", 16), Pipeline(4, "1F1B", 16)
    assert [gpipe.in_flight(r) for r in range(4)] == [16] * 4  # every forward before any backward
    assert [one_f_one_b.in_flight(r) for r in range(4)] == [4, 3, 2, 1]  # p - r
    assert gpipe.head_in_flight() == 16 and one_f_one_b.head_in_flight() == 1


@pytest.mark.parametrize("p, v", [(4, 2), (8, 2)])
def test_interleaving_keeps_one_plus_p_minus_1_over_pv_of_1f1b(p, v):
    layers = p * v * 4
    interleaved, plain = Pipeline(p, "Interleaved1F1B", 4 * p), Pipeline(p, "1F1B", 4 * p)
    per_stage = layers // interleaved.stages
    kept = interleaved.in_flight(0) * per_stage
    assert kept / (plain.in_flight(0) * layers // p) == pytest.approx(1 + (p - 1) / (p * v))


def test_layers_split_in_order_with_embedding_first_and_head_last():
    pipeline = Pipeline(4, "1F1B", 4)
    assert [len(r) for r in pipeline.layers_of_stage(10)] == [3, 3, 2, 2]
    first = {n for n, _ in nd.rank_tensors(LLAMA_70B, pipeline, 0)}
    last = {n for n, _ in nd.rank_tensors(LLAMA_70B, pipeline, 3)}
    assert "model.embed_tokens.weight" in first and "lm_head.weight" not in first
    assert {"lm_head.weight", "model.norm.weight"} <= last and "model.embed_tokens.weight" not in last
    held = sum(len(nd.rank_tensors(LLAMA_70B, pipeline, r)) for r in range(4))
    assert held == len(LLAMA_70B.tensors)  # every tensor on exactly one stage


def test_states_per_stage_are_the_stages_share():
    """pp 4 over 32 GPUs with FSDP 8 inside a stage: each rank's states are its stage's tensors / 8 at 16 B."""
    layout = nd.Layout("fsdp", Mesh(pp=4, dp_shard=8), schedule="1F1B", microbatches=4)
    pipeline = layout.pipeline
    for rank in range(4):
        tensors = nd.rank_tensors(LLAMA_70B, pipeline, rank)
        numel = sum(-(-__import__("math").prod(s) // 8) for _, s in tensors)
        assert nd._rank_row(layout, LLAMA_70B, rank, None, 4096, 1, True, "adamw", nd.LLAMA_TP_PLAN,
                            _profile(), 2, 2).states == numel * 16


def _profile() -> Profile:
    return Profile(layers=80, layer=34 * 4096 * 8192, kept=2 * 4096 * 8192, rest=4096 * 128256 * 4, source="test")


def test_gpipe_keeps_more_activations_than_1f1b_and_the_point_to_point_bytes():
    rows = {s: nd.row(nd.Layout("fsdp", Mesh(pp=4, dp_shard=8), schedule=s, microbatches=8), LLAMA_70B, gpus=32,
                      nodes=4, gpu_memory=80 * 10**9, seq_len=4096, profile=_profile()) for s in ("GPipe", "1F1B")}
    assert rows["GPipe"].activations > 1.8 * rows["1F1B"].activations
    boundary = 4096 * 8192 * 2  # one micro-batch's hidden state, 16-bit
    assert rows["1F1B"].traffic["pp"] == 2 * 8 * boundary  # forward activations + backward gradients, m of each
    assert rows["1F1B"].bubble == pytest.approx(3 / 11)


def test_data_parallel_pipeline_rank_reduces_to_the_whole_profile():
    """pp 1: one rank holds the whole model and exactly the traced total (the same figure as the main table)."""
    profile = _profile()
    row = nd.row(nd.Layout("fsdp", Mesh(dp_shard=32)), LLAMA_70B, gpus=32, nodes=4, gpu_memory=80 * 10**9,
                 seq_len=4096, profile=profile)
    assert row.activations == profile.total(True)


@pytest.mark.parametrize("text, name", [("1f1b", "1F1B"), ("gpipe", "GPipe"), ("interleaved-1f1b", "Interleaved1F1B"),
                                        ("Interleaved1F1B", "Interleaved1F1B")])
def test_schedule_names(text, name):
    assert schedule_name(text) == name


@pytest.mark.parametrize("pipeline, layers, message", [
    (Pipeline(8, "1F1B", 4), 80, "--microbatches 4 is fewer than the 8 pipeline stages"),
    (Pipeline(4, "Interleaved1F1B", 6), 80, "6 is not a multiple of pp 4"),
    (Pipeline(8, "Interleaved1F1B", 8), 12, "needs 16 stages, more than the model's 12 layers"),
])
def test_pipeline_rules(pipeline, layers, message):
    with pytest.raises(AccelkitError, match=message):
        check_pipeline(pipeline, layers)


# Llama 3.1 405B, torchtitan docs/performance.md Table 5 (commit 9dec370, 2024-12-26): 512 H100 (95 GiB), FSDP 8 x
# TP 8 (with sequence parallelism and loss parallelism) x PP 8, local batch 32 at 8,192 tokens, full activation
# checkpointing, FSDP reducing in fp32; micro-batches: torchtitan's default, one per stage (8 for 1F1B, 16 for
# Interleaved1F1B with 2 stages per rank). Peak reserved memory, the maximum over all GPUs: 82.5 and 72.7 GiB.
TORCHTITAN_405B = {"1F1B": (8, 82.5), "Interleaved1F1B": (16, 72.7)}


@pytest.mark.parametrize("schedule", list(TORCHTITAN_405B))
def test_torchtitan_405b_on_paper_within_ten_percent(schedule):
    from accelkit.plan.published import torchtitan_405b

    planned, published = torchtitan_405b(schedule)
    assert published == TORCHTITAN_405B[schedule][1]
    assert abs(planned - published) / published <= 0.10, (planned, published)


def test_gpt3_175b_64_x_8_x_8_shape():
    """GPT-3 175B on 4,096 GPUs as 64 (data) x 8 (pipeline) x 8 (tensor): 12 layers a stage, 1/64 of the model
    per GPU, tensor groups inside an 8-GPU machine."""
    from accelkit.plan.published import gpt3_175b

    model = gpt3_175b()
    assert model.parameters == pytest.approx(175e9, rel=0.01)
    layout = nd.Layout("ddp", Mesh(pp=8, dp_replicate=64, tp=8), schedule="1F1B", microbatches=8)
    assert layout.world == 4096 and nd.unavailable(layout, model, 4096, 512) is None
    assert [len(r) for r in layout.pipeline.layers_of_stage(model.layers)] == [12] * 8
    middle = nd._rank_row(layout, model, 3, None, 2048, 1, True, "adamw", nd.LLAMA_TP_PLAN, _profile(), 2, 2)
    assert middle.states == 12 * 12 * 12288**2 // 8 * 16 + 12 * 2 * 12288 * 16  # 12 layers' tp shard, 16 B each
    assert middle.states == pytest.approx(model.parameters / 64 * 16, rel=0.02)  # about 1/64 of the model
    row = nd.row(layout, model, gpus=4096, nodes=512, gpu_memory=None, seq_len=2048)
    assert row.worst_rank == 0 and row.states > middle.states  # the embeddings' stage holds the most


def _plan(*args: str) -> dict:
    import json

    from click.testing import CliRunner

    from accelkit.commands.plan import command

    result = CliRunner().invoke(command, [*args, "--json"], standalone_mode=False)
    assert result.exception is None, result.output
    return json.loads(result.output)


def test_checkpointing_comes_before_offload_and_the_batch_advice_stays():
    """70B on 64 x 80 GB at 8,192 tokens: the main table without checkpointing fits only with offload; the plan
    adds checkpointing (cheaper) and recommends FSDP full shard, never offload, with the learning rate."""
    plan = _plan("--params", "70B", "--num-processes", "64", "--num-machines", "8", "--gpu-memory", "80GB",
                 "--seq-len", "8192", "--base-lr", "3e-4", "--base-batch", "32")
    assert plan["recommendation"]["strategy"] == "fsdp-full"
    assert plan["training"]["activation_checkpointing"] is True
    assert "--activation-checkpointing" in plan["recommendation"]["config_command"]
    assert any(note.startswith("activation checkpointing added") for note in plan["notes"])
    assert plan["learning_rate"]["effective_batch"] == 64


def test_a_given_pipeline_layout_is_the_recommendation_with_its_commands():
    plan = _plan("--params", "1B", "--layout", "dp_shard=2,pp=2", "--pp-schedule", "interleaved-1f1b",
                 "--microbatches", "4", "--gpu-memory", "80GB", "--seq-len", "1024")
    rec = plan["recommendation"]
    assert rec["layout"] == "dp_shard=2,pp=2" and rec["fits"] is True
    assert "--pp-size 2 --pp-schedule interleaved1f1b --microbatches 4" in rec["config_command"]
    assert "--mixed-precision bf16" in rec["launch_command"]
    pipeline = plan["nd"]["rows"][0]["pipeline"]
    assert pipeline["bubble"] == pytest.approx(1 / 8) and pipeline["stages_per_rank"] == 2
    assert plan["learning_rate"] is None


def test_write_config_writes_the_pipeline_layout_that_config_check_accepts(tmp_path):
    from click.testing import CliRunner

    from accelkit.cli import cli

    runner = CliRunner()
    written = tmp_path / "pp.yaml"
    result = runner.invoke(cli, ["plan", "--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=2,pp=2",
                                 "--pp-schedule", "Interleaved1F1B", "--microbatches", "4",
                                 "--write-config", str(written)])
    assert result.exit_code == 0, result.output
    assert "# accelkit-pipeline: pp=2,schedule=interleaved1f1b,microbatches=4,dp_shard=2,tp=1" in written.read_text()
    checked = runner.invoke(cli, ["config", "--check", str(written)])
    assert checked.exit_code == 0, checked.output


def test_model_states_of_the_templates_pipeline_as_measured():
    """benchmarks/plan_accuracy.py's pipeline rows, measured 2026-11-27 in CPU rehearsals of the causal-lm template
    (2 layers, hidden 64, its byte-level vocabulary of 257): FSDP2 shards each tensor by dim-0 rows, so the LM head's
    257 rows put 129 on the first rank of 2, 32 elements more than an even split of its elements."""
    model = nd.Model.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=257, intermediate=128)
    alone = nd.row(nd.Layout("ddp", Mesh(pp=2), microbatches=2), model, gpus=2, nodes=1, gpu_memory=None,
                   seq_len=16, micro_batch=2, compute_bytes=4)
    sharded = nd.row(nd.Layout("fsdp", Mesh(pp=2, dp_shard=2), microbatches=2), model, gpus=4, nodes=1,
                     gpu_memory=None, seq_len=16, micro_batch=2, compute_bytes=4)
    # A pipeline alone (ddp) is priced without checkpointing, as the template runs it: the first stage, holding two
    # micro-batches' activations under 1F1B, is the rank that needs the most; its states are the embeddings' stage.
    assert (alone.worst_rank, alone.states) == (0, 855_040)
    assert (sharded.worst_rank, sharded.states) == (1, 428_544)


# benchmarks/plan_accuracy.py's pipeline activations, measured 2026-11-29 (pp 2, 4 micro-batches of 1 x 16 tokens,
# fp32): per pipeline rank, the peak bytes alive at once of the tensors saved for the backward and of the stage
# outputs torch caches (fwd_cache) until their micro-batch's backward: the 16 x 64 fp32 hidden state the first stage
# sent on, the last stage's 16 x 257 fp32 logits. The plan's profile of the template's model as traced there (72,064
# bytes a layer, 43,472 outside the layers, one micro-batch's logits among them).
TEMPLATE_PROFILE = Profile(layers=2, layer=72_064, kept=5_184, rest=43_472, source="traced")
MEASURED = {"1F1B": (152_832, 112_704), "GPipe": (305_152, 449_280)}
# of which saved for the backward alone (the logits are not: the loss saves its log-softmax, not its input)
MEASURED_SAVED = {"1F1B": (144_640, 96_256), "GPipe": (288_768, 383_488)}
HIDDEN, LOGITS = 16 * 64 * 4, 16 * 257 * 4


@pytest.mark.parametrize("schedule", ["1F1B", "GPipe"])
def test_in_flight_activations_of_the_templates_pipeline_as_measured(schedule):
    model = nd.Model.llama(layers=2, hidden=64, heads=4, kv_heads=2, vocab=257, intermediate=128)
    layout = nd.Layout("ddp", Mesh(pp=2), schedule=schedule, microbatches=4)
    planned = [nd._rank_row(layout, model, rank, None, 16, 1, False, "adamw", nd.LLAMA_TP_PLAN, TEMPLATE_PROFILE,
                            4, 4).activations for rank in range(2)]
    first, last = MEASURED[schedule]
    # the first stage keeps its layer and the hidden state it sent on per micro-batch in flight (2 under 1F1B, 4
    # under GPipe): within 1% (the plan leaves out its 128 bytes of token ids a micro-batch)
    assert planned[0] == pytest.approx(first, rel=0.01)
    # the last stage: its layer, norm, head and loss, and the logits cached until each micro-batch's backward (1
    # under 1F1B, 4 under GPipe): within 3% (the plan's loss over 16 tokens, the template's over 15)
    assert planned[1] == pytest.approx(last, rel=0.03)
    # what the stage caches is exactly what the probe found beyond the saved tensors
    in_flight = {"1F1B": (2, 1), "GPipe": (4, 4)}[schedule]
    assert (first - MEASURED_SAVED[schedule][0], last - MEASURED_SAVED[schedule][1]) == \
        (in_flight[0] * HIDDEN, in_flight[1] * LOGITS)
