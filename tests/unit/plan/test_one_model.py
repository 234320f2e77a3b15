"""One memory model (issue 34, item 5): the N-D rows and the data-parallel table price the same job the same way,
and the reasons the recommendation gives are true."""

from __future__ import annotations

import pytest

from accelkit.plan import nd_report
from accelkit.plan.inputs import Hardware, Training
from accelkit.plan.models import ShapeFlags, resolve_model
from accelkit.plan.planner import make_plan

GiB = 2**30


def test_the_unsplit_layout_is_the_tables_fsdp_row():
    """fsdp dp_shard=8 in the N-D section and FSDP full shard in the table: the same traced activations, the same
    buffers, model states equal to within padding."""
    spec = resolve_model(None, ShapeFlags(16, 2048, 16, 8, 32000, 5632), None)
    plan = make_plan(spec, Hardware(8, 1, 24 * GiB, None),
                     Training(seq_len=4096, micro_batch=2, activation_checkpointing=True))
    _, data, advice = nd_report.nd_section(plan)
    layout, table = advice.rows[0], plan.row("fsdp-full")
    assert layout.layout.name == "dp_shard=8"
    assert layout.activations == table.activations
    assert layout.gathered == table.buffers
    assert layout.states == pytest.approx(table.states.total, rel=1e-5)
    assert "traced on the meta device with and without checkpointing" in data["activations_source"]
    cp = next(r for r in advice.rows if r.layout.name == "dp_shard=4,cp=2")
    assert cp.activations == pytest.approx(table.activations / 2, rel=1e-6)  # the sequence's half of the same trace


def test_offload_reason_says_the_states_fit_when_they_do():
    spec = resolve_model(None, ShapeFlags(4, 1024, 8, 8, 32000, 2816), None)
    plan = make_plan(spec, Hardware(2, 1, 15 * GiB, 512 * GiB), Training(seq_len=8192, micro_batch=4))
    assert plan.recommendation.strategy == "fsdp-offload"
    assert plan.row("fsdp-full").states.total < plan.row("fsdp-full").gpu_usable
    assert "the model states fit" in plan.recommendation.reason
    assert "do not fit in GPU memory" not in plan.recommendation.reason


def test_a_layout_is_the_one_recommendation_when_no_data_parallel_strategy_fits():
    """131k tokens on 8 x 24 GB: no data-parallel strategy fits even with checkpointing (the logits alone are
    too big); splitting the sequence does, and it is the recommendation, in the text and in the JSON."""
    import json

    from click.testing import CliRunner

    from accelkit.commands.plan import command

    args = ["--layers", "4", "--hidden", "1024", "--heads", "8", "--vocab", "32000", "--num-processes", "8",
            "--gpu-memory", "24GiB", "--cpu-memory", "64GiB", "--seq-len", "131072"]
    text = CliRunner().invoke(command, args, standalone_mode=False)
    assert text.exception is None, text.output
    assert "Recommendation: none" not in text.output
    assert "Recommendation: fsdp: dp_shard" in text.output or "Recommendation: deepspeed" in text.output
    plan = json.loads(CliRunner().invoke(command, [*args, "--json"], standalone_mode=False).output)
    rec = plan["recommendation"]
    assert rec["kind"] == "layout" and rec["fits"] is True and rec["layout"]
    assert "--mixed-precision bf16" in rec["config_command"]
    assert plan["training"]["activation_checkpointing"] is True  # the cheaper remedy was tried first
    assert plan["learning_rate"] is None and "Batch:" in text.output


def test_write_config_writes_the_recommended_layout(tmp_path):
    """--write-config writes the layout the plan recommends, built like `accelkit config` builds it: the mesh
    sizes, the precision and the checkpointing of the planned job."""
    import yaml
    from click.testing import CliRunner

    from accelkit.commands.plan import command

    path = tmp_path / "nd.yaml"
    result = CliRunner().invoke(command, ["--layers", "4", "--hidden", "1024", "--heads", "8", "--vocab", "32000",
                                          "--num-processes", "8", "--gpu-memory", "24GiB", "--cpu-memory", "64GiB",
                                          "--seq-len", "131072", "--write-config", str(path)],
                                standalone_mode=False)
    assert result.exception is None, result.output
    config = yaml.safe_load(path.read_text())
    mesh = config["parallelism_config"]
    assert (mesh["parallelism_config_dp_shard_size"], mesh["parallelism_config_cp_size"]) == (4, 2)
    assert config["mixed_precision"] == "bf16" and config["fsdp_config"]["fsdp_activation_checkpointing"] is True
    assert "--dp-shard-size 4 --cp-size 2" in result.output
