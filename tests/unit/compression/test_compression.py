"""Gradient compression (issue 35): the spec and its one place, the backend checks, ZeRO++ accepted by DeepSpeed's
own config class, the bytes computed from shapes, and what templates build from the environment variable."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from helpers import REPO_ROOT, invoke_accelkit

from accelkit.compression.checks import start_step_warning, steps_of_script
from accelkit.compression.compression_spec import CompressionSpec, parse_env_value, read_compression_comment
from accelkit.compression.grad_bytes import (
    ddp_bytes_per_step,
    fsdp_reduce_scatter_bytes,
    powersgd_elements,
    traffic_factor,
)
from accelkit.errors import AccelkitError


@pytest.mark.parametrize("spec", [CompressionSpec("fp16"), CompressionSpec("bf16"), CompressionSpec("powersgd", 4, 0),
                                  CompressionSpec("powersgd", 1, 1000)])
def test_env_value_round_trips(spec: CompressionSpec) -> None:
    assert parse_env_value(spec.env_value()) == spec


@pytest.mark.parametrize("text", ["zstd", "fp16:rank=2", "powersgd:rank=x", "powersgd:depth=2"])
def test_bad_env_values_are_refused(text: str) -> None:
    with pytest.raises(AccelkitError):
        parse_env_value(text)


def test_powersgd_state_options_follow_torchs_rule_for_early_starts() -> None:
    """torch's PowerSGDState refuses error feedback / warm start with start_powerSGD_iter <= 1."""
    from torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook import PowerSGDState

    for start in (0, 1, 2, 1000):
        PowerSGDState(process_group=None, **CompressionSpec("powersgd", 4, start).powersgd_state_options())
    assert CompressionSpec("powersgd", 4, 0).powersgd_state_options()["use_error_feedback"] is False
    assert "use_error_feedback" not in CompressionSpec("powersgd", 4, 2).powersgd_state_options()


def test_powersgd_bytes_match_the_measured_ratio_of_design_md() -> None:
    """DESIGN.md: rank 1 on a 256x256 + 256x10 MLP sends 65.5x fewer elements."""
    shapes = [(256, 256), (256,), (10, 256), (10,)]
    none = ddp_bytes_per_step(shapes, CompressionSpec(), 1)
    compressed = ddp_bytes_per_step(shapes, CompressionSpec("powersgd", 1, 0), 1)
    assert none / compressed == pytest.approx(65.48, abs=0.01)
    assert powersgd_elements((256,), 1) == 256  # a bias is never worth compressing
    assert ddp_bytes_per_step(shapes, CompressionSpec("powersgd", 1, 5), 5) == none  # before the start step
    assert ddp_bytes_per_step(shapes, CompressionSpec("fp16"), 1) == none // 2


def test_fsdp_reduce_scatter_pads_dim0_and_halves_in_bf16() -> None:
    shapes = [(3, 4), (3,)]
    assert fsdp_reduce_scatter_bytes(shapes, 2, 4) == (4 * 4 + 4) * 4
    assert fsdp_reduce_scatter_bytes(shapes, 2, 2) * 2 == fsdp_reduce_scatter_bytes(shapes, 2, 4)
    assert traffic_factor(CompressionSpec("bf16")) == 0.5 and traffic_factor(None) == 1.0


def test_start_step_warning_names_both_numbers() -> None:
    assert steps_of_script(["--max-steps", "20"]) == 20 and steps_of_script(["--max_steps=7"]) == 7
    warning = start_step_warning(CompressionSpec("powersgd", 1, 1000), 20)
    assert warning is not None and "1000" in warning and "20 steps" in warning
    assert start_step_warning(CompressionSpec("powersgd", 1, 0), 20) is None


def test_config_writes_the_comment_line_that_launch_reads(tmp_path: Path) -> None:
    out = tmp_path / "ddp.yaml"
    result = invoke_accelkit(*["config", "--backend", "ddp", "--num-processes", "2", "--grad-compression", "powersgd",
                              "--powersgd-rank", "4", "--powersgd-start-step", "0", "-o", str(out)])
    assert result.returncode == 0, result.stderr
    assert read_compression_comment(out.read_text(), str(out)) == CompressionSpec("powersgd", 4, 0)
    import yaml

    assert "grad_compression" not in json.dumps(yaml.safe_load(out.read_text()))  # not an Accelerate key
    from accelerate.commands.config.config_args import load_config_from_file

    load_config_from_file(str(out))  # Accelerate still loads it
    script = tmp_path / "t.py"
    script.write_text("print('hi')\n")
    dry = invoke_accelkit("launch", "--cpu", "--config", str(out), "--dry-run", str(script))
    assert dry.returncode == 0, dry.stderr
    assert "ACCELKIT_GRAD_COMPRESSION=powersgd:rank=4,start=0" in dry.stdout


def test_zeropp_json_is_accepted_by_deepspeeds_own_config_class(tmp_path: Path) -> None:
    out, ds = tmp_path / "ds.yaml", tmp_path / "ds.json"
    result = invoke_accelkit(*["config", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "16",
                              "--num-machines", "2", "--main-process-ip", "10.0.0.1", "--grad-compression", "int8",
                              "--deepspeed-json", str(ds), "-o", str(out)])
    assert result.returncode == 0, result.stderr
    content = json.loads(ds.read_text())
    zero = content["zero_optimization"]
    assert (zero["zero_quantized_weights"], zero["zero_quantized_gradients"], zero["zero_hpz_partition_size"]) == \
        (True, True, 8)  # hpZ: the 8 processes of one machine
    from deepspeed.runtime.config import DeepSpeedConfig

    filled = {k: v for k, v in content.items() if v != "auto"}
    filled.update(fp16={"enabled": False}, bf16={"enabled": False}, train_batch_size=1,
                  train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    parsed = DeepSpeedConfig(filled)
    assert parsed.zero_config.zero_quantized_weights and parsed.zero_config.zero_quantized_gradients
    assert parsed.zero_config.zero_hpz_partition_size == 8
    one = invoke_accelkit(*["config", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "8",
                           "--grad-compression", "int8", "--deepspeed-json", str(tmp_path / "one.json"), "-o",
                           str(tmp_path / "one.yaml")])
    assert one.returncode == 0, one.stderr
    assert json.loads((tmp_path / "one.json").read_text())["zero_optimization"]["zero_hpz_partition_size"] == 1


def _template_block():
    spec = importlib.util.spec_from_file_location("minimal_train", REPO_ROOT / "templates" / "minimal" / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.grad_compression_kwargs


def test_the_template_block_builds_what_accelerate_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from accelerate.utils import DDPCommunicationHookType

    build = _template_block()
    monkeypatch.delenv("ACCELKIT_GRAD_COMPRESSION", raising=False)
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    assert build() == {}
    monkeypatch.setenv("ACCELKIT_GRAD_COMPRESSION", "powersgd:rank=4,start=0")
    handler = build()["kwargs_handlers"][0]
    assert handler.comm_hook is DDPCommunicationHookType.POWER_SGD
    assert handler.comm_state_option == {"matrix_approximation_rank": 4, "start_powerSGD_iter": 0,
                                         "use_error_feedback": False, "warm_start": False}
    monkeypatch.setenv("ACCELKIT_GRAD_COMPRESSION", "fp16")
    assert build()["kwargs_handlers"][0].comm_hook is DDPCommunicationHookType.FP16
    monkeypatch.setenv("ACCELKIT_GRAD_COMPRESSION", "bf16")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")  # what accelerate launch exports for an fsdp_version 2 config
    policy = build()["fsdp_plugin"].mixed_precision_policy
    assert policy.reduce_dtype is torch.bfloat16


def test_config_check_judges_the_comment_line_against_the_files_backend(tmp_path: Path) -> None:
    config = tmp_path / "fsdp.yaml"
    config.write_text("# accelkit-grad-compression: powersgd:rank=2,start=0\ndistributed_type: FSDP\n"
                      "num_processes: 2\nnum_machines: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n"
                      "fsdp_config:\n  fsdp_version: 2\n")
    result = invoke_accelkit("config", "--check", str(config))
    assert result.returncode == 1
    assert "the accelkit-grad-compression line: --grad-compression powersgd is not an FSDP option" in result.stderr


def test_config_int8_writes_the_deepspeed_json_beside_the_yaml_and_prints_no_deepspeed_noise(tmp_path: Path) -> None:
    out = invoke_accelkit("config", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "2",
                          "--grad-compression", "int8", "-o", str(tmp_path / "ds.yaml"))
    assert out.returncode == 0, out.stderr
    written = tmp_path / "ds.deepspeed.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ds.deepspeed.json", "ds.yaml"]
    assert json.loads(written.read_text())["zero_optimization"]["zero_quantized_weights"] is True
    assert f"deepspeed_config_file: {written}" in (tmp_path / "ds.yaml").read_text()
    assert out.stdout.splitlines()[0].startswith(f"Wrote {tmp_path / 'ds.yaml'} and {written}")
    assert "WARNING" not in out.stdout + out.stderr and "real_accelerator" not in out.stdout + out.stderr
