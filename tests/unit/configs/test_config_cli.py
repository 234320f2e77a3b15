"""`accelkit config` through click: messages, exit codes, files, --list and --check findings."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner
from helpers import run_accelkit
from helpers.config import accelerate_roundtrip

from accelkit.cli import cli
from accelkit.configs import machine_defaults
from accelkit.configs import options as options_module
from accelkit.configs.choices import Backend, OffloadDevice
from accelkit.configs.presets import list_presets


@pytest.fixture(autouse=True)
def no_gpus(monkeypatch):
    monkeypatch.setattr(machine_defaults, "gpu_count", lambda: 0)


def run(*args: str):
    return CliRunner().invoke(cli, ["config", *args], catch_exceptions=False)


def test_prints_yaml_with_the_command_in_the_header():
    result = run("--backend", "fsdp", "--num-processes", "8", "--wrap-cls", "GPT2Block")
    assert result.exit_code == 0, result.output
    header = "# Written by: accelkit config --backend fsdp --num-processes 8 --wrap-cls GPT2Block"
    assert result.stdout.startswith(header)
    config = yaml.safe_load(result.stdout)
    assert config["distributed_type"] == "FSDP" and config["num_processes"] == 8
    assert config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"] == "GPT2Block"


def test_dash_output_prints_the_yaml_and_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run("--backend", "ddp", "--num-processes", "2", "-o", "-")
    assert result.exit_code == 0, result.output
    assert yaml.safe_load(result.stdout)["num_processes"] == 2
    assert list(tmp_path.iterdir()) == []


def test_writes_file_that_accelerate_loads_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "ddp.yaml"
    result = run("--backend", "ddp", "--num-processes", "4", "--mixed-precision", "bf16", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"Wrote {out}" in result.stdout
    written = yaml.safe_load(out.read_text())
    accelerate_roundtrip(out, written)
    before = out.read_text()
    again = run("--backend", "ddp", "--num-processes", "2", "-o", str(out))
    assert again.exit_code == 1 and "already exists" in again.output and "--force" in again.output
    assert out.read_text() == before
    forced = run("--backend", "ddp", "--num-processes", "2", "-o", str(out), "--force")
    assert forced.exit_code == 0 and yaml.safe_load(out.read_text())["num_processes"] == 2


def test_deepspeed_json_is_written_beside_the_yaml(tmp_path):
    out, ds = tmp_path / "ds.yaml", tmp_path / "ds_config.json"
    result = run("--backend", "deepspeed", "--zero-stage", "3", "--offload", "--deepspeed-json", str(ds),
                 "-o", str(out))
    assert result.exit_code == 0, result.output
    config = yaml.safe_load(out.read_text())
    assert config["deepspeed_config"]["deepspeed_config_file"] == str(ds.resolve())
    assert "zero_stage" not in config["deepspeed_config"]
    assert json.loads(ds.read_text())["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    # existing JSON is protected too
    again = run("--backend", "deepspeed", "--deepspeed-json", str(ds), "-o", str(tmp_path / "other.yaml"))
    assert again.exit_code == 1 and "already exists" in again.output
    assert not (tmp_path / "other.yaml").exists()


@pytest.mark.parametrize(("args", "words"), [
    (["--backend", "fsdp", "--zero-stage", "2"], "--zero-stage is a DeepSpeed option"),
    (["--num-processes", "0"], "--num-processes must be at least 1"),
    (["--backend", "ddp", "--num-processes", "3", "--num-machines", "2"], "not divisible"),
    (["--backend", "ddp", "--num-machines", "2", "--machine-rank", "2"], "outside 0..1"),
    (["--backend", "cpu", "--mixed-precision", "fp16"], "fp16"),
    (["--preset", "nope"], "unknown preset `nope`"),
])
def test_bad_options_exit_1_with_error_and_hint(args, words):
    result = run(*args)
    assert result.exit_code == 1
    assert "Error: " in result.output and words in result.output and "Hint:" in result.output
    assert "Traceback" not in result.output


def test_usage_errors_exit_2():
    assert run("--backend", "tpu").exit_code == 2
    assert run("--list", "--backend", "ddp").exit_code == 2
    assert run("--list", "--check", "x.yaml").exit_code == 2


def test_transformer_wrap_without_class_warns_but_writes():
    result = run("--backend", "fsdp", "--wrap-policy", "transformer")
    assert result.exit_code == 0
    assert "Warning: transformer wrap policy without a layer class" in result.stderr
    assert "--wrap-cls" in result.stderr
    assert yaml.safe_load(result.stdout)["distributed_type"] == "FSDP"


def test_default_wrap_policy_says_nothing():
    """Issue 32 item 5: the transformer policy as a default (or in a file, as `accelerate config` and `accelkit init`
    write it for Transformers models) is the usual setting: no warning on `--backend fsdp` alone."""
    result = run("--backend", "fsdp")
    assert result.exit_code == 0
    assert "Warning" not in result.stderr


def test_list_shows_every_preset_with_its_description():
    result = run("--list")
    assert result.exit_code == 0
    for preset in list_presets():
        assert any(line.startswith(preset.name) and preset.description in line for line in result.stdout.splitlines())


def test_option_choices_match_the_library():
    """config and launch take every ConfigOptions field as its flag, with the library's choices (derived, not
    copied: the click options are made from the dataclass's metadata)."""
    from dataclasses import fields

    from accelkit.commands.config import command as config_command
    from accelkit.commands.launch import command as launch_command

    for command in (config_command, launch_command):
        params = {p.name: p for p in command.params}
        for f in fields(options_module.ConfigOptions):
            assert options_module.flag_name(f.name) in params[f.name].opts, (command.name, f.name)
        assert tuple(params["backend"].type.choices) == Backend.values()
        assert tuple(params["offload_optimizer"].type.choices) == OffloadDevice.values()
        assert tuple(params["offload_params"].type.choices) == OffloadDevice.values()


# --check: one file per problem the issue lists, each finding with its fix -------------------------------------

GOOD = {"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 4,
        "num_machines": 1, "machine_rank": 0, "mixed_precision": "no", "use_cpu": False}
FSDP = {**GOOD, "distributed_type": "FSDP", "fsdp_config": {"fsdp_version": 2, "fsdp_auto_wrap_policy": "NO_WRAP",
                                                            "fsdp_reshard_after_forward": True}}


@pytest.mark.parametrize(("config", "severity", "words", "fix"), [
    ({**GOOD, "num_processes": 3, "num_machines": 2, "main_process_ip": "h"}, "Error", "not divisible", "TOTAL"),
    ({**GOOD, "num_processes": 1}, "Warning", "DDP with one process", "number of GPUs"),
    ({**FSDP, "num_processes": 1}, "Warning", "FSDP with one process", "number of GPUs"),
    ({**GOOD, "use_cpu": True, "distributed_type": "NO", "num_processes": 1, "mixed_precision": "fp16"}, "Error",
     "fp16 mixed precision does not run on CPU", "bf16"),
    ({**GOOD, "num_proceses": 4}, "Error", "unknown key `num_proceses`", "rename it to `num_processes`"),
    ({**FSDP, "fsdp_config": {"fsdp_version": 2, "fsdp_ofload_params": True}}, "Error",
     "unknown key `fsdp_config.fsdp_ofload_params`", "`fsdp_offload_params`"),
    ({**FSDP, "fsdp_config": {"fsdp_version": 1, "fsdp_reshard_after_forward": "SHARD_GRAD_OP"}}, "Error",
     "launcher's default FULL_SHARD wins", "fsdp_sharding_strategy: SHARD_GRAD_OP"),
    ({**FSDP, "fsdp_config": {"fsdp_auto_wrap_policy": "NO_WRAP"}}, "Warning", "uses FSDP1", "fsdp_version: 2"),
    ({**GOOD, "num_machines": 2, "main_process_ip": "h", "rdzv_backend": "c10d"}, "Warning", "has no effect",
     "--rdzv_backend"),
    ({**GOOD, "enable_cpu_affinity": True}, "Warning", "has no effect", "--enable_cpu_affinity"),
    ({**GOOD, "machine_rank": 1}, "Error", "machine_rank 1 is outside 0..0", "rank 0"),
    # an error, as `accelkit launch` refuses it: one rule set, one verdict (issue 14, item 10)
    ({**GOOD, "num_machines": 2, "num_processes": 4}, "Error", "no main_process_ip", "main_process_ip"),
    ({**GOOD, "distributed_type": "MULTI_CPU", "use_cpu": True, "num_processes": 2}, "Warning",
     "starts ONE process", "accelkit launch --cpu"),
])
def test_check_reports_each_problem_with_its_fix(config, severity, words, fix, tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run("--check", str(path))
    assert f"{severity}: " in result.stderr and words in result.stderr, result.output
    assert "Hint: " in result.stderr and fix in result.stderr, result.stderr
    assert result.exit_code == (1 if severity == "Error" else 0)


def test_check_deepspeed_json_plus_conflicting_keys(tmp_path):
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    config = {**GOOD, "distributed_type": "DEEPSPEED", "mixed_precision": "bf16",
              "deepspeed_config": {"deepspeed_config_file": str(ds), "zero_stage": 2, "gradient_accumulation_steps": 1}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run("--check", str(path))
    assert result.exit_code == 1
    assert "gradient_accumulation_steps" in result.stderr and "zero_stage" in result.stderr
    assert "mixed_precision" in result.stderr and "DeepSpeed JSON" in result.stderr


def test_check_missing_json_and_bad_yaml(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "distributed_type": "DEEPSPEED",
                                    "deepspeed_config": {"deepspeed_config_file": str(tmp_path / "none.json")}}))
    result = run("--check", str(path))
    assert result.exit_code == 1 and "does not exist" in result.stderr
    path.write_text("distributed_type: [MULTI_GPU\n")
    result = run("--check", str(path))
    assert result.exit_code == 1 and "not valid YAML" in result.stderr
    result = run("--check", str(tmp_path / "missing.yaml"))
    assert result.exit_code == 1 and "does not exist" in result.output


def test_check_reports_what_accelerates_loader_refuses(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**GOOD, "distributed_type": "MULTI_GPUS"}))
    result = run("--check", str(path))
    assert result.exit_code == 1 and "Accelerate's loader refuses the file" in result.stderr


def test_check_accepts_a_generated_file(tmp_path):
    out = tmp_path / "c.yaml"
    assert run("--backend", "deepspeed", "--zero-stage", "3", "-o", str(out)).exit_code == 0
    result = run("--check", str(out))
    assert result.exit_code == 0 and "OK" in result.stdout and result.stderr == ""


def test_real_process_no_traceback_and_exit_codes():
    # Real processes through main(); both cases stay clear of torch, so they are quick.
    listed = run_accelkit("config", "--list")
    assert listed.returncode == 0 and "two_node_fsdp" in listed.stdout
    bad = run_accelkit("config", "--backend", "fsdp", "--num-processes", "0")
    assert bad.returncode == 1
    assert bad.stderr.startswith("Error: --num-processes must be at least 1") and "Hint:" in bad.stderr
    assert "Traceback" not in bad.stderr
    usage = run_accelkit("config", "--zero-stage", "7")
    assert usage.returncode == 2 and "Traceback" not in usage.stderr
