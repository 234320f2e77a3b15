"""Pipeline parallelism in the one option table and rule set (issue 34, item 1): `--pp-size`, `--pp-schedule` and
`--microbatches` filled, refused with the reason in one line, written where the ranks read them (the
accelkit-pipeline comment and $ACCELKIT_PIPELINE), and the written YAML still accepted by Accelerate's own loader
and launcher."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers.config import accelerate_roundtrip, launcher_env

from accelkit.configs import ConfigOptions, compat, machine_defaults, write_config
from accelkit.configs.pipeline_spec import (
    ENV_VAR,
    PipelineSpec,
    of_parallelism,
    parse_pipeline,
    pipeline_with_config_comment,
)
from accelkit.configs.resolve import resolve_config
from accelkit.errors import AccelkitError


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)
    monkeypatch.setattr(compat, "gaps", lambda **_: iter(()))


def resolve(**given):
    return resolve_config(ConfigOptions(**given), launch=True)


def refused(**given) -> str:
    with pytest.raises(AccelkitError) as info:
        resolve(**given)
    return str(info.value)


@pytest.mark.parametrize(("given", "spec"), [
    ({"backend": "ddp", "num_processes": 2, "pp_size": 2}, "pp=2,schedule=1f1b,microbatches=2,dp_shard=1,tp=1"),
    ({"backend": "fsdp", "num_processes": 4, "pp_size": 2, "pp_schedule": "gpipe", "microbatches": 4},
     "pp=2,schedule=gpipe,microbatches=4,dp_shard=2,tp=1"),  # dp_shard takes what pp leaves
    ({"backend": "fsdp", "num_processes": 8, "pp_size": 2, "tp_size": 2, "pp_schedule": "interleaved1f1b",
      "microbatches": 4}, "pp=2,schedule=interleaved1f1b,microbatches=4,dp_shard=2,tp=2"),
])
def test_pipeline_is_filled_and_spelled_for_the_ranks(given: dict, spec: str) -> None:
    config = resolve(**given)
    pipeline = of_parallelism(config.parallelism)
    assert pipeline is not None and pipeline.env_value() == spec
    assert parse_pipeline(spec) == pipeline
    assert config.pipeline_env() == {ENV_VAR: spec}  # what launch gives every rank
    assert config.parallelism.total == given["num_processes"]
    assert resolve(backend="ddp", num_processes=2).pipeline_env() == {}
    # Accelerate's ParallelismConfig has no pp: no parallelism_config, or Accelerator() would refuse the sizes.
    assert "parallelism_config" not in config.to_accelerate_dict()


@pytest.mark.parametrize(("given", "words"), [
    ({"backend": "ddp", "num_processes": 2, "microbatches": 4},
     "--microbatches 4 applies to a pipeline, but there is none (pp_size is 1)"),
    ({"backend": "ddp", "num_processes": 2, "pp_schedule": "gpipe"},
     "--pp-schedule gpipe applies to a pipeline, but there is none"),
    ({"backend": "ddp", "num_processes": 2, "pp_size": 2, "microbatches": 1},
     "--microbatches 1 is fewer than the 2 pipeline stages (pp 2)"),
    ({"backend": "ddp", "num_processes": 4, "pp_size": 4, "pp_schedule": "interleaved1f1b", "microbatches": 9},
     "the interleaved schedules run the microbatches in rounds of one per pipeline rank, and 9 is not a multiple "
     "of pp 4"),
    ({"backend": "deepspeed", "num_processes": 2, "pp_size": 2},
     "--pp-size 2 with --backend deepspeed: DeepSpeed's pipeline engine is not reachable through Accelerate"),
    ({"backend": "fsdp", "num_processes": 4, "pp_size": 2, "cp_size": 2},
     "--pp-size 2 with --cp-size 2: the pipeline composes with FSDP2 (dp_shard) and tensor parallelism (tp) only"),
    ({"backend": "fsdp", "num_processes": 8, "pp_size": 2, "dp_replicate_size": 2, "dp_shard_size": 2},
     "--pp-size 2 with --dp-replicate-size 2"),
    ({"backend": "ddp", "num_processes": 4, "pp_size": 2},
     "--pp-size 2 on --num-processes 4 under --backend ddp leaves 2 replicas of the pipeline"),
    ({"backend": "fsdp", "num_processes": 4, "pp_size": 3}, "--pp-size 3 does not divide --num-processes 4"),
    ({"backend": "fsdp", "num_processes": 4, "pp_size": 2, "dp_shard_size": 3},
     "the parallelism sizes (pp 2 x dp_shard 3 = 6) do not multiply to --num-processes 4"),
    ({"backend": "ddp", "num_processes": 2, "pp_size": 0}, "--pp-size 0: a parallelism size is at least 1"),
    ({"backend": "fsdp", "num_processes": 2, "pp_size": 2}, "pp 2 under --backend fsdp leaves FSDP nothing to shard "
     "(dp_shard is 1)"),
])
def test_pipeline_layouts_that_cannot_run_are_refused(given: dict, words: str) -> None:
    assert words in refused(**given)


def test_stages_are_checked_against_the_models_layers(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"num_hidden_layers": 2, "num_attention_heads": 4}')
    words = refused(backend="ddp", num_processes=4, pp_size=4, model_config=model)
    assert "--pp-size 4 makes 4 pipeline stages, but the model has 2 decoder layers" in words
    words = refused(backend="ddp", num_processes=2, pp_size=2, pp_schedule="interleaved1f1b", model_config=model)
    assert "makes 4 pipeline stages (2 per process with --pp-schedule interleaved1f1b)" in words
    assert resolve(backend="ddp", num_processes=2, pp_size=2, model_config=model).parallelism.pp == 2
    # The templates' own model, read from the script's syntax tree (LlamaConfig(num_hidden_layers=2)).
    script = Path(__file__).resolve().parents[3] / "templates" / "causal-lm" / "train.py"
    assert "has 2 decoder layers" in refused(backend="ddp", num_processes=4, pp_size=4, model_config=script)


def test_written_config_carries_the_pipeline_and_accelerate_accepts_it(tmp_path: Path) -> None:
    config = resolve_config(ConfigOptions(backend="fsdp", num_processes=4, pp_size=2, pp_schedule="gpipe",
                                          microbatches=4))
    path = tmp_path / "pp.yaml"
    write_config(config, path, "accelkit config ...")
    text = path.read_text()
    assert "# accelkit-pipeline: pp=2,schedule=gpipe,microbatches=4,dp_shard=2,tp=1" in text
    assert f"set {ENV_VAR}=pp=2" in text
    accelerate_roundtrip(path, yaml.safe_load(text))
    args, env = launcher_env(path)
    assert env.get("ACCELERATE_USE_PARALLELISM_CONFIG") != "true"
    # launch --config FILE reads it back; flags given on the command line win.
    options, labels = pipeline_with_config_comment(ConfigOptions(), {}, path)
    assert (options.pp_size, options.pp_schedule, options.microbatches, options.dp_shard_size) == (2, "gpipe", 4, 2)
    assert labels["pp_size"] == str(path)
    mine, _ = pipeline_with_config_comment(ConfigOptions(pp_size=4), {}, path)
    assert mine.pp_size == 4 and mine.pp_schedule is None


@pytest.mark.parametrize("text", ["pp=1", "pp=2,schedule=zigzag", "pp=2,stages=3", "schedule=1f1b"])
def test_a_bad_pipeline_line_is_refused(text: str) -> None:
    with pytest.raises(AccelkitError):
        parse_pipeline(text)


def test_spec_counts_stages_per_rank() -> None:
    assert PipelineSpec(pp=2, schedule="1f1b").stages == 2
    assert PipelineSpec(pp=2, schedule="interleaved1f1b").stages == 4


def test_config_check_reads_the_pipeline_line(tmp_path: Path) -> None:
    from accelkit.configs.files import check_config

    config = resolve_config(ConfigOptions(backend="fsdp", num_processes=4, pp_size=2, microbatches=4))
    good = tmp_path / "pp.yaml"
    write_config(config, good, "accelkit config ...")
    assert [f for f in check_config(good) if f.is_error] == []
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("microbatches=4", "microbatches=1"))
    errors = [f.message for f in check_config(bad) if f.is_error]
    assert errors == ["microbatches 1 is fewer than the 2 pipeline stages (pp 2): every schedule needs a "
                      "microbatch for each stage in flight"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(good.read_text().replace("schedule=1f1b", "schedule=zigzag"))
    assert any("schedule 'zigzag' is not a pipeline schedule" in f.message for f in check_config(broken) if f.is_error)
