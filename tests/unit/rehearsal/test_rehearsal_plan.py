"""Unit tests of accelkit.rehearsal: the plan for each backend, refusals, version guard, shim guards, bootstrap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.rehearsal import rehearse_dict

from accelkit.errors import AccelkitError
from accelkit.rehearsal import shim, versions
from accelkit.rehearsal.cpu_config import RehearsalPlan

FSDP2 = {
    "compute_environment": "LOCAL_MACHINE",
    "distributed_type": "FSDP",
    "num_processes": 2,
    "mixed_precision": "bf16",
    "gpu_ids": "0,1",
    "fsdp_config": {"fsdp_version": 2, "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_offload_params": False},
}
DEEPSPEED = {
    "distributed_type": "DEEPSPEED",
    "num_processes": 2,
    "mixed_precision": "no",
    "deepspeed_config": {"zero_stage": 3, "offload_optimizer_device": "none", "offload_param_device": "none"},
}


def test_fsdp_plan_keeps_config_and_sets_cpu_env():
    plan = rehearse_dict(FSDP2)
    assert isinstance(plan, RehearsalPlan)
    assert plan.backend == "fsdp"
    launch = plan.launch_config
    # The launcher must still see FSDP (it turns the fsdp_config into FSDP_* env vars) but no GPU ids.
    assert launch["distributed_type"] == "FSDP"
    assert launch["fsdp_config"] == FSDP2["fsdp_config"]
    assert launch["use_cpu"] is True and "gpu_ids" not in launch
    assert plan.env == {"ACCELKIT_REHEARSAL": "fsdp", "ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu",
                        "CUDA_VISIBLE_DEVICES": ""}
    assert plan.notes == () and plan.bootstrap
    assert FSDP2["gpu_ids"] == "0,1" and "use_cpu" not in FSDP2  # input untouched


def test_ddp_plan_uses_torchrun_launcher():
    for distributed_type in ("MULTI_GPU", "MULTI_CPU"):
        plan = rehearse_dict({"distributed_type": distributed_type, "num_processes": 4})
        assert plan.backend == "ddp"
        # MULTI_CPU would go to Accelerate's mpirun launcher (or one process); MULTI_GPU is torchrun.
        assert plan.launch_config["distributed_type"] == "MULTI_GPU"
        assert plan.env["ACCELERATE_USE_CPU"] == "true"
        assert "DS_ACCELERATOR" not in plan.env
        # The shim's backend selection is needed when a script touches PartialState() before Accelerator().
        assert plan.bootstrap


def test_single_process_plan():
    plan = rehearse_dict({"distributed_type": "NO", "num_processes": 1})
    assert plan.backend == "single"
    assert plan.launch_config["use_cpu"] is True
    assert not plan.bootstrap  # one plain CPU process: nothing to patch


def test_deepspeed_plan_keeps_cpu_false_and_selects_cpu_accelerator():
    plan = rehearse_dict(DEEPSPEED)
    assert plan.backend == "deepspeed"
    assert plan.launch_config["deepspeed_config"] == DEEPSPEED["deepspeed_config"]
    assert plan.env["DS_ACCELERATOR"] == "cpu"
    # Accelerate ignores DeepSpeed when cpu=True, so the ranks must not get ACCELERATE_USE_CPU=true.
    assert plan.env["ACCELERATE_USE_CPU"] == "false"


def test_deepspeed_multinode_uses_torchrun_launcher():
    plan = rehearse_dict({**DEEPSPEED, "num_machines": 2, "num_processes": 4, "main_process_ip": "127.0.0.1"})
    assert plan.launch_config["deepspeed_config"]["deepspeed_multinode_launcher"] == "standard"
    assert plan.launch_config["deepspeed_config"]["zero_stage"] == 3
    assert "deepspeed_multinode_launcher" not in DEEPSPEED["deepspeed_config"]
    assert any("torchrun" in note for note in plan.notes)


def test_fsdp1_turns_off_gpu_only_options_with_a_note():
    config = {"distributed_type": "FSDP", "num_processes": 2,
              "fsdp_config": {"fsdp_version": 1, "fsdp_sharding_strategy": "FULL_SHARD", "fsdp_offload_params": True}}
    plan = rehearse_dict(config)
    fsdp = plan.launch_config["fsdp_config"]
    assert fsdp["fsdp_sync_module_states"] is False
    assert fsdp["fsdp_cpu_ram_efficient_loading"] is False
    assert fsdp["fsdp_offload_params"] is False
    assert fsdp["fsdp_sharding_strategy"] == "FULL_SHARD"
    assert any("fsdp_sync_module_states" in note for note in plan.notes)
    assert any("fsdp_offload_params" in note for note in plan.notes)
    assert config["fsdp_config"]["fsdp_offload_params"] is True


def test_fsdp2_options_untouched():
    plan = rehearse_dict({**FSDP2, "fsdp_config": {"fsdp_version": 2, "fsdp_reshard_after_forward": False}})
    assert plan.launch_config["fsdp_config"] == {"fsdp_version": 2, "fsdp_reshard_after_forward": False}


@pytest.mark.parametrize("config, fragment", [
    ({**FSDP2, "mixed_precision": "fp16"}, "fp16"),
    ({**DEEPSPEED, "mixed_precision": "fp16"}, "fp16"),
    ({**FSDP2, "mixed_precision": "fp8"}, "fp8"),
    ({**DEEPSPEED, "deepspeed_config": {"zero_stage": 3, "offload_param_device": "nvme"}}, "NVMe"),
    ({**DEEPSPEED, "deepspeed_config": {"zero_stage": 2, "offload_optimizer_device": "nvme"}}, "NVMe"),
    ({"distributed_type": "XLA", "num_processes": 8}, "XLA"),
    ({"distributed_type": "MEGATRON_LM", "num_processes": 8}, "MEGATRON_LM"),
    ({"distributed_type": "MULTI_GPU", "num_processes": 1}, "at least 2"),
])
def test_refusals(config, fragment):
    with pytest.raises(AccelkitError) as error:
        rehearse_dict(config)
    assert fragment in error.value.message
    assert error.value.hint


def test_deepspeed_json_is_checked(tmp_path: Path):
    ds_json = tmp_path / "ds.json"
    config = {"distributed_type": "DEEPSPEED", "num_processes": 2,
              "deepspeed_config": {"deepspeed_config_file": str(ds_json)}}
    with pytest.raises(AccelkitError, match="does not exist"):
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"fp16": {"enabled": True}, "zero_optimization": {"stage": 2}}))
    with pytest.raises(AccelkitError, match="fp16"):
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}}))
    with pytest.raises(AccelkitError, match="NVMe"):
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"optimizer": {"type": "OneBitAdam"}, "zero_optimization": {"stage": 1}}))
    with pytest.raises(AccelkitError, match="OneBitAdam"):
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"optimizer": {"type": "Lion"}, "zero_optimization": {"stage": 2}}))
    with pytest.raises(AccelkitError, match="Lion"):  # FusedLion is CUDA-only; offloaded Lion is CPU Lion
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}}))
    assert any("FusedAdam" in note for note in rehearse_dict(config).notes)
    ds_json.write_text("{not json")
    with pytest.raises(AccelkitError, match="not valid JSON"):
        rehearse_dict(config)
    ds_json.write_text(json.dumps({"optimizer": {"type": "AdamW"}, "bf16": {"enabled": True},
                                   "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}}}))
    plan = rehearse_dict(config)
    assert plan.backend == "deepspeed" and plan.bootstrap
    assert any("CPU Adam" in note for note in plan.notes)  # first run compiles DeepSpeed's CPU Adam


def test_missing_deepspeed_is_refused_with_install_hint(monkeypatch):
    real = versions.installed_version
    monkeypatch.setattr("accelkit.rehearsal.cpu_config.installed_version",
                        lambda dist: None if dist == "deepspeed" else real(dist))
    with pytest.raises(AccelkitError) as error:
        rehearse_dict(DEEPSPEED)
    assert "not installed" in error.value.message
    assert "accelkit[deepspeed]" in error.value.hint


@pytest.mark.parametrize("accelerate_version, ok", [
    ("1.13.0", True), ("1.15.0", True), ("1.15.3", True), ("1.15.0.dev0", True), ("1.12.0", False),
    ("1.16.0", False), ("2.0.0", False),
])
def test_version_guard(monkeypatch, accelerate_version, ok):
    monkeypatch.delenv(versions.ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setattr(versions, "installed_version",
                        lambda dist: accelerate_version if dist == "accelerate" else "0.19.8")
    if ok:
        versions.check_versions("fsdp")
        return
    with pytest.raises(AccelkitError) as error:
        rehearse_dict(FSDP2)
    assert accelerate_version in error.value.message and ">=1.13.0,<1.16.0" in error.value.message
    assert versions.ALLOW_UNTESTED_ENV in error.value.hint
    monkeypatch.setenv(versions.ALLOW_UNTESTED_ENV, "1")
    assert rehearse_dict(FSDP2).backend == "fsdp"


def test_deepspeed_version_guard(monkeypatch):
    monkeypatch.delenv(versions.ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setattr(versions, "installed_version", lambda dist: "1.15.0" if dist == "accelerate" else "0.14.0")
    versions.check_versions("fsdp")  # deepspeed's version does not matter without DeepSpeed
    with pytest.raises(AccelkitError, match="deepspeed >=0.19.0,<0.20.0; 0.14.0"):
        versions.check_versions("deepspeed")


def test_shim_refuses_changed_accelerate_internals(monkeypatch):
    from accelerate.state import AcceleratorState, PartialState

    def prepare_backend(self, use_cpu=False):  # a hypothetical future signature
        return None, None

    monkeypatch.setattr(PartialState, "_prepare_backend", prepare_backend)
    with pytest.raises(AccelkitError, match="_prepare_backend"):
        shim._patch_backend_selection()
    assert PartialState._prepare_backend is prepare_backend  # nothing half-patched

    def init(self, mixed_precision=None, cpu=False, **kwargs):
        pass

    monkeypatch.setattr(AcceleratorState, "__init__", init)
    with pytest.raises(AccelkitError, match="fsdp_plugin"):
        shim._patch_fsdp_upgrade()


def test_shim_refuses_when_cuda_is_visible(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(AccelkitError, match="CUDA"):
        shim._apply("fsdp")  # what install() runs once the script has imported Accelerate


def _bootstrap(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k != "ACCELKIT_REHEARSAL"}
    full_env.update(env)
    return subprocess.run([sys.executable, "-m", "accelkit.ranks.bootstrap", *args], cwd=cwd, env=full_env,
                          text=True, capture_output=True, timeout=120)


def test_bootstrap_runs_script_as_main_with_its_argv_and_exit_code(tmp_path: Path):
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    (scripts / "helper_mod.py").write_text("VALUE = 41\n")
    (scripts / "user.py").write_text(
        "import sys, helper_mod\n"
        "print('NAME', __name__, 'ARGV', sys.argv, 'VALUE', helper_mod.VALUE + 1)\n"
        "sys.exit(int(sys.argv[-1]))\n"
    )
    result = _bootstrap("scripts/user.py", "--flag", "x", "3", cwd=tmp_path, env={"ACCELKIT_REHEARSAL": "single"})
    assert result.returncode == 3, result.stderr
    assert "NAME __main__ ARGV ['scripts/user.py', '--flag', 'x', '3'] VALUE 42" in result.stdout

    (scripts / "crash.py").write_text("def boom():\n    raise ValueError('user bug')\nboom()\n")
    result = _bootstrap("scripts/crash.py", cwd=tmp_path, env={"ACCELKIT_REHEARSAL": "single"})
    assert result.returncode == 1
    assert "ValueError: user bug" in result.stderr and "crash.py" in result.stderr


def test_bootstrap_runs_module(tmp_path: Path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint('MOD', __name__, sys.argv[1:])\n")
    result = _bootstrap("-m", "mypkg.train", "--lr", "1", cwd=tmp_path, env={"ACCELKIT_REHEARSAL": "single"})
    assert result.returncode == 0, result.stderr
    assert "MOD __main__ ['--lr', '1']" in result.stdout


def test_bootstrap_patches_only_once_the_script_imports_accelerate(tmp_path: Path):
    (tmp_path / "user.py").write_text(
        "import sys\n"
        "print('BEFORE', 'accelerate' in sys.modules, 'torch' in sys.modules)\n"
        "from accelerate.state import AcceleratorState, PartialState\n"
        "print('AFTER', getattr(PartialState._prepare_backend, '_accelkit_patched', False),\n"
        "      getattr(AcceleratorState.__init__, '_accelkit_patched', False))\n"
    )
    result = _bootstrap("user.py", cwd=tmp_path, env={"ACCELKIT_REHEARSAL": "fsdp", "CUDA_VISIBLE_DEVICES": ""})
    assert result.returncode == 0, result.stderr
    assert "BEFORE False False" in result.stdout  # the bootstrap imported neither torch nor Accelerate
    assert "AFTER True True" in result.stdout


def test_bootstrap_outside_rehearsal_fails_clearly(tmp_path: Path):
    (tmp_path / "user.py").write_text("print('RAN')\n")
    result = _bootstrap("user.py", cwd=tmp_path, env={})
    assert result.returncode == 1
    assert "RAN" not in result.stdout
    assert "Error:" in result.stderr and "accelkit launch --cpu" in result.stderr
    result = _bootstrap("user.py", cwd=tmp_path, env={"ACCELKIT_REHEARSAL": "tpu"})
    assert result.returncode == 1 and "Unknown rehearsal backend" in result.stderr


def test_one_version_table():
    """pyproject's lower bounds and the launch page's rehearsal paragraph state the ranges of versions.SUPPORTED."""
    import re

    from helpers import REPO_ROOT
    from packaging.version import Version

    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    readme = " ".join((REPO_ROOT / "docs" / "commands" / "launch.md").read_text().split())
    for supported in versions.SUPPORTED.values():
        low = re.search(rf'"{supported.dist}>=([\d.]+)', pyproject)
        assert low and Version(low.group(1)) == Version(supported.low), supported.dist
        short_low, short_high = (".".join(v.split(".")[:2]) for v in (supported.low, supported.high))
        assert f"{supported.dist} >={short_low},<{short_high}" in readme, supported.dist
        assert all(version in readme for version in supported.tested), supported.dist
