"""accelkit.configs: presets and generated configs load with Accelerate's loader, round-trip, and reach the ranks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from helpers.config import accelerate_roundtrip, build_plugin, findings, launcher_env

from accelkit.configs import ConfigOptions, load_accelerate_config, machine_defaults, resolve_config, write_config
from accelkit.configs.presets import list_presets
from accelkit.errors import AccelkitError

EXPECTED_PRESETS = {"single", "cpu", "ddp", "fsdp", "fsdp_offload", "deepspeed_zero1", "deepspeed_zero2",
                    "deepspeed_zero3", "deepspeed_zero3_offload", "two_node_fsdp"}


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    """Defaults must not depend on the test machine."""
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)


def write(config, tmp_path: Path, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    write_config(config, path, "accelkit config (test)")
    return path


def built(options: ConfigOptions, base: dict | None = None):
    """(the typed config, its Accelerate dict)."""
    resolved = resolve_config(options, base=base)
    return resolved, resolved.to_accelerate_dict()


def test_every_preset_is_there_with_a_description():
    presets = {p.name: p for p in list_presets()}
    assert set(presets) >= EXPECTED_PRESETS
    for p in presets.values():
        assert p.description and not p.description.startswith("(no description"), p.name
        assert p.path.read_text().startswith("# "), p.name


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_preset_loads_with_accelerate_and_builds_to_itself(name, tmp_path):
    preset = next(p for p in list_presets() if p.name == name)
    raw = yaml.safe_load(preset.path.read_text())
    accelerate_roundtrip(preset.path, raw)
    assert load_accelerate_config(preset.path) == raw
    assert [f for f in findings(raw) if f.severity == "error"] == []
    # `--preset NAME` with no other option reproduces the file exactly.
    assert resolve_config(ConfigOptions(preset=name)).to_accelerate_dict() == raw


@pytest.mark.parametrize("options", [
    ConfigOptions(backend="single"),
    ConfigOptions(backend="cpu"),
    ConfigOptions(backend="cpu", num_processes=1, mixed_precision="bf16"),
    ConfigOptions(backend="ddp", num_processes=8, mixed_precision="bf16"),
    ConfigOptions(backend="ddp", num_processes=16, num_machines=2, machine_rank=1, main_process_ip="10.1.2.3"),
    ConfigOptions(backend="fsdp", wrap_cls=("LlamaDecoderLayer", "LlamaEmbedding"), state_dict="full"),
    ConfigOptions(backend="fsdp", fsdp_version=1, sharding="grad-op", cpu_ram_efficient_loading=True),
    ConfigOptions(backend="fsdp", fsdp_version=1, sharding="no", wrap_policy="size", min_num_params=1000),
    ConfigOptions(backend="fsdp", sharding="hybrid", num_machines=2, num_processes=4, main_process_ip="h0"),
    ConfigOptions(backend="fsdp", offload=True, activation_checkpointing=True, wrap_policy="none"),
    ConfigOptions(backend="deepspeed", zero_stage=0),
    ConfigOptions(backend="deepspeed", zero_stage=1, offload_optimizer="cpu", gradient_accumulation_steps=4),
    ConfigOptions(backend="deepspeed", zero_stage=3, offload=True, zero3_save_16bit_model=True),
    ConfigOptions(backend="deepspeed", zero_stage=3, offload_params="nvme", nvme_path="/nvme"),
    ConfigOptions(backend="deepspeed", num_processes=4, num_machines=2, main_process_ip="h0", mixed_precision="fp16"),
], ids=lambda o: "-".join(f"{k}={v}" for k, v in o.given().items()))
def test_generated_config_roundtrips_and_the_launcher_accepts_it(options, tmp_path, monkeypatch):
    resolved, config = built(options)
    path = write(resolved, tmp_path)
    accelerate_roundtrip(path, config)
    assert path.read_text().startswith("# Written by: accelkit config (test)")
    args, env = launcher_env(path)
    assert args.num_processes == config["num_processes"]
    build_plugin(env, monkeypatch)  # the plugin a rank builds accepts the environment


def test_fsdp1_writes_sharding_strategy_so_the_launcher_default_does_not_win(tmp_path, monkeypatch):
    resolved, config = built(ConfigOptions(backend="fsdp", fsdp_version=1, sharding="grad-op"))
    assert config["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"
    _, env = launcher_env(write(resolved, tmp_path))
    assert env["FSDP_SHARDING_STRATEGY"] == "SHARD_GRAD_OP"
    assert str(build_plugin(env, monkeypatch).sharding_strategy) == "ShardingStrategy.SHARD_GRAD_OP"


@pytest.mark.parametrize(("sharding", "reshard"), [("full", True), ("grad-op", False)])
def test_fsdp2_maps_sharding_to_reshard_after_forward(sharding, reshard, tmp_path, monkeypatch):
    resolved, config = built(ConfigOptions(backend="fsdp", sharding=sharding))
    assert config["fsdp_config"]["fsdp_version"] == 2
    assert config["fsdp_config"]["fsdp_reshard_after_forward"] is reshard
    assert "fsdp_sharding_strategy" not in config["fsdp_config"]
    _, env = launcher_env(write(resolved, tmp_path))
    assert build_plugin(env, monkeypatch).reshard_after_forward is reshard


def test_fsdp2_hybrid_becomes_a_parallelism_config(tmp_path):
    resolved, config = built(ConfigOptions(backend="fsdp", sharding="hybrid", num_machines=2, num_processes=16,
                                           main_process_ip="h0"))
    _, env = launcher_env(write(resolved, tmp_path))
    assert env["PARALLELISM_CONFIG_DP_REPLICATE_SIZE"] == "2"
    assert env["PARALLELISM_CONFIG_DP_SHARD_SIZE"] == "8"


def test_deepspeed_json_never_both(tmp_path, monkeypatch):
    ds_json = tmp_path / "ds.json"
    resolved, config = built(ConfigOptions(backend="deepspeed", zero_stage=3, offload=True, mixed_precision="bf16",
                                           gradient_accumulation_steps=2, deepspeed_json=ds_json))
    section = config["deepspeed_config"]
    assert section["deepspeed_config_file"] == str(ds_json.resolve())
    assert "mixed_precision" not in config
    assert not {"zero_stage", "offload_optimizer_device", "offload_param_device", "gradient_accumulation_steps",
                "gradient_clipping", "zero3_save_16bit_model"} & set(section)
    path = write(resolved, tmp_path)
    content = json.loads(ds_json.read_text())
    assert content["zero_optimization"]["stage"] == 3
    assert content["zero_optimization"]["offload_param"]["device"] == "cpu"
    assert content["bf16"]["enabled"] is True and content["fp16"]["enabled"] is False
    assert content["gradient_accumulation_steps"] == 2
    assert content["train_micro_batch_size_per_gpu"] == "auto"
    accelerate_roundtrip(path, config)
    _, env = launcher_env(path)
    plugin = build_plugin(env, monkeypatch)  # Accelerate raises here if the YAML also held conflicting keys
    assert plugin.zero_stage == 3 and plugin.offload_param_device == "cpu"


def test_deepspeed_json_leaves_precision_auto_when_not_chosen(tmp_path):
    resolved = resolve_config(ConfigOptions(backend="deepspeed", deepspeed_json=tmp_path / "ds.json"))
    content = resolved.deepspeed.json_content
    assert content["fp16"]["enabled"] == "auto"
    assert content["gradient_accumulation_steps"] == "auto"


def test_conflicting_yaml_keys_are_what_accelerate_rejects(tmp_path, monkeypatch):
    """The --check rule matches Accelerate: a YAML with both is refused when the rank builds its plugin."""
    ds_json = tmp_path / "ds.json"
    write(resolve_config(ConfigOptions(backend="deepspeed", deepspeed_json=ds_json)), tmp_path)
    bad = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "DEEPSPEED", "num_processes": 2,
           "mixed_precision": "no", "deepspeed_config": {"deepspeed_config_file": str(ds_json), "zero_stage": 2}}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(bad))
    assert any("zero_stage" in f.message and f.severity == "error" for f in findings(bad))
    _, env = launcher_env(path)
    with pytest.raises(ValueError, match="deepspeed_config_file"):
        build_plugin(env, monkeypatch)


def test_preset_with_overrides(tmp_path):
    resolved, config = built(ConfigOptions(preset="deepspeed_zero3_offload", zero_stage=2, num_processes=8))
    ds = config["deepspeed_config"]
    # stage 2 cannot offload parameters: the preset's param offload is dropped, optimizer offload kept
    assert ds["zero_stage"] == 2 and ds["offload_param_device"] == "none" and ds["offload_optimizer_device"] == "cpu"
    assert "zero3_init_flag" not in ds and config["num_processes"] == 8
    accelerate_roundtrip(write(resolved, tmp_path), config)


def test_base_config_keeps_keys_accelkit_does_not_model(tmp_path):
    base = built(ConfigOptions(backend="fsdp", fsdp_version=1))[1]
    base["gpu_ids"] = "0,1"
    base["fsdp_config"]["fsdp_backward_prefetch"] = "BACKWARD_POST"
    config = built(ConfigOptions(mixed_precision="bf16", sharding="grad-op"), base=base)[1]
    assert config["gpu_ids"] == "0,1" and config["mixed_precision"] == "bf16"
    assert config["fsdp_config"]["fsdp_backward_prefetch"] == "BACKWARD_POST"
    assert config["fsdp_config"]["fsdp_sharding_strategy"] == "SHARD_GRAD_OP"


def test_defaults_follow_the_gpus(monkeypatch):
    assert built(ConfigOptions())[1]["distributed_type"] == "NO"
    assert built(ConfigOptions(backend="fsdp"))[1]["num_processes"] == 2
    assert built(ConfigOptions(backend="cpu"))[1]["num_processes"] == 2
    assert built(ConfigOptions(backend="single"))[1]["num_processes"] == 1
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 8)
    config = built(ConfigOptions())[1]
    assert config["distributed_type"] == "MULTI_GPU" and config["num_processes"] == 8
    assert built(ConfigOptions(backend="deepspeed", num_machines=2, main_process_ip="h"))[1]["num_processes"] == 16


@pytest.mark.parametrize(("options", "words"), [
    (ConfigOptions(num_processes=0), "--num-processes must be at least 1"),
    (ConfigOptions(backend="ddp", num_processes=3, num_machines=2), "not divisible by --num-machines 2"),
    (ConfigOptions(backend="ddp", num_machines=2, machine_rank=2), "--machine-rank 2 is outside 0..1"),
    (ConfigOptions(backend="ddp", num_machines=0), "--num-machines must be at least 1"),
    (ConfigOptions(backend="fsdp", zero_stage=2), "--zero-stage is a DeepSpeed option"),
    (ConfigOptions(backend="fsdp", zero_stage=0), "--zero-stage is a DeepSpeed option"),
    (ConfigOptions(backend="ddp", wrap_cls=("X",)), "--wrap-cls is an FSDP option"),
    (ConfigOptions(backend="ddp", offload=True), "--offload needs --backend fsdp or deepspeed"),
    (ConfigOptions(backend="cpu", mixed_precision="fp16"), "fp16 mixed precision does not run on CPU"),
    (ConfigOptions(backend="single", num_processes=2), "--backend single runs one process"),
    (ConfigOptions(backend="single", num_machines=2), "not 2 machines"),
    (ConfigOptions(backend="fsdp", wrap_policy="size", wrap_cls=("X",)), "--wrap-cls only applies"),
    (ConfigOptions(backend="fsdp", sharding="no"), "FSDP2 has no NO_SHARD"),
    (ConfigOptions(backend="fsdp", sharding="hybrid"), "only one machine"),
    (ConfigOptions(backend="deepspeed", zero_stage=2, offload_params="cpu"), "only at ZeRO stage 3"),
    (ConfigOptions(backend="deepspeed", zero_stage=0, offload=True), "stage 0 cannot offload"),
    (ConfigOptions(backend="deepspeed", offload_optimizer="nvme"), "--nvme-path"),
    (ConfigOptions(backend="deepspeed", zero_stage=2, zero3_save_16bit_model=True), "stage 3 only"),
    (ConfigOptions(backend="ddp", gradient_accumulation_steps=4), "only for DeepSpeed"),
    (ConfigOptions(backend="ddp", main_process_port=70000), "is not a TCP port"),
    (ConfigOptions(preset="ddp", backend="fsdp"), "contradicts preset `ddp`"),
    (ConfigOptions(preset="fdsp"), "did you mean `fsdp`"),
])
def test_bad_combinations_are_clear_errors(options, words):
    with pytest.raises(AccelkitError) as info:
        resolve_config(options)
    text = info.value.format_message()
    assert words in text
    assert info.value.hint


def test_base_with_json_reference_refuses_inline_deepspeed_options(tmp_path):
    resolved, base = built(ConfigOptions(backend="deepspeed", deepspeed_json=tmp_path / "ds.json"))
    write(resolved, tmp_path)
    with pytest.raises(AccelkitError, match="takes its DeepSpeed settings from"):
        resolve_config(ConfigOptions(zero_stage=3), base=base)
    assert built(ConfigOptions(num_processes=4), base=base)[1]["deepspeed_config"] == base["deepspeed_config"]


def test_write_config_leaves_no_partial_files(tmp_path, monkeypatch):
    from accelkit.configs import render

    config = resolve_config(ConfigOptions(backend="deepspeed", deepspeed_json=tmp_path / "ds.json"))

    def explode(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(render, "render_yaml", explode)
    with pytest.raises(OSError):
        write_config(config, tmp_path / "c.yaml", "x")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.parametrize("precision", [None, "bf16"])
def test_every_auto_in_the_deepspeed_json_is_filled_by_accelerate(precision, tmp_path, monkeypatch):
    """Replay what Accelerator does at prepare(): after it fills the JSON, no "auto" may be left for DeepSpeed."""
    config = resolve_config(ConfigOptions(backend="deepspeed", zero_stage=3, mixed_precision=precision,
                                          deepspeed_json=tmp_path / "ds.json"))
    _, env = launcher_env(write(config, tmp_path))
    plugin = build_plugin(env, monkeypatch)
    plugin.set_mixed_precision(precision or "fp16")
    plugin.fill_match("gradient_accumulation_steps", must_match=False, gradient_accumulation_steps=2)
    # the values Accelerator._prepare_deepspeed passes for a DataLoader with batch size 4 on 2 processes
    plugin.deepspeed_config_process(must_match=False, **{
        "gradient_clipping": 1.0, "zero_optimization.stage3_gather_16bit_weights_on_model_save": False,
        "train_micro_batch_size_per_gpu": 4, "train_batch_size": 4 * 2 * 2})

    def autos(node, prefix=""):
        for key, value in node.items():
            if isinstance(value, dict):
                yield from autos(value, f"{prefix}{key}.")
            elif value == "auto":
                yield prefix + key

    assert list(autos(plugin.deepspeed_config)) == []
    enabled = "bf16" if precision == "bf16" else "fp16"
    assert plugin.deepspeed_config[enabled]["enabled"] is True


def test_messages_name_each_value_as_it_was_given():
    """One rule, worded by where each value came from: a flag, a file, a default (never a flag nobody typed)."""
    from accelkit.configs import resolve_config

    file = {"distributed_type": "MULTI_GPU", "num_processes": 3, "num_machines": 2, "main_process_ip": "h"}
    cases = [
        (dict(options=ConfigOptions(backend="ddp", num_processes=3, num_machines=2)),
         "--num-processes 3 is not divisible by --num-machines 2"),
        (dict(options=ConfigOptions(), base=file, base_label="c.yaml"),
         "num_processes 3 is not divisible by num_machines 2"),
        (dict(options=ConfigOptions(num_processes=5), base=file, base_label="c.yaml"),
         "--num-processes 5 is not divisible by num_machines 2"),
        (dict(options=ConfigOptions(backend="deepspeed", offload_params="cpu")),
         "DeepSpeed offloads parameters only at ZeRO stage 3 (the stage is 2 by default)"),
        (dict(options=ConfigOptions(num_processes=2, zero_stage=3)),
         "--zero-stage is a DeepSpeed option, but the backend is ddp (default for 2 processes)"),
    ]
    for kwargs, words in cases:
        with pytest.raises(AccelkitError) as info:
            resolve_config(**kwargs)
        assert info.value.message.startswith(words), (info.value.message, words)


def test_every_value_knows_its_source():
    from accelkit.configs import resolve_config

    base = {"distributed_type": "FSDP", "num_processes": 4, "mixed_precision": "bf16",
            "fsdp_config": {"fsdp_state_dict_type": "FULL_STATE_DICT"}}
    config = resolve_config(ConfigOptions(num_processes=8), base=base, base_label="f.yaml",
                            labels={"num_machines": "--nodes"})
    assert {name: str(config.source(name)) for name in ("num_processes", "mixed_precision", "state_dict",
                                                        "num_machines", "sharding")} == {
        "num_processes": "--num-processes", "mixed_precision": "f.yaml", "state_dict": "f.yaml",
        "num_machines": "--nodes", "sharding": "default"}
    # No fsdp_version in the file: the launcher's FSDP1 is kept (and said to be a default), not accelkit's FSDP2.
    assert config.fsdp.version == 1 and "launcher's default" in str(config.source("fsdp_version"))


def test_findings_carry_a_code_the_key_and_the_flag():
    found = {f.code: f for f in findings({"distributed_type": "MULTI_GPU", "num_processes": 3, "num_machines": 2,
                                          "machine_rank": 5})}
    assert found["processes-divisible"].key == "num_processes"
    assert found["processes-divisible"].flag == "--num-processes"
    assert found["machine-rank-range"].is_error and found["main-address-missing"].flag == "--main-process-ip"
