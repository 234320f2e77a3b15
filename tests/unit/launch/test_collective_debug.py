"""GPU launches turn on NCCL's flight recorder (verified on the dry-run command, since there is no GPU here); CPU
rehearsals do not; values the user exported win."""

from __future__ import annotations

import shlex

import pytest
from click.testing import CliRunner
from helpers import DATA

from accelkit.cli import cli
from accelkit.launch.collective_debug import NCCL_DEBUG_ENV, gpu_debug_env
from accelkit.launch.launch_plan import LAUNCHER_MODULE

PROBE = DATA / "launch" / "probe.py"


@pytest.fixture(autouse=True)
def _config_in_tmp_path(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the dry run keeps its config: keep it here


def command_env(*args: str) -> dict[str, str]:
    """The VAR=value prefix of the command `accelkit launch --dry-run ARGS` prints last."""
    result = CliRunner().invoke(cli, ["launch", "--dry-run", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    words = shlex.split(result.stdout.strip().splitlines()[-1])
    env = {}
    for word in words[:words.index("-m")]:
        if "=" in word:
            name, value = word.split("=", 1)
            env[name] = value
    assert LAUNCHER_MODULE in words
    return env


def test_gpu_launch_sets_up_the_flight_recorder(monkeypatch):
    for name in NCCL_DEBUG_ENV:
        monkeypatch.delenv(name, raising=False)
    env = command_env("--backend", "fsdp", "--num-processes", "8", str(PROBE))
    assert {name: env.get(name) for name in NCCL_DEBUG_ENV} == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_DESYNC_DEBUG": "1"}
    assert "TORCH_DISTRIBUTED_DEBUG" not in env


def test_cpu_rehearsal_has_no_nccl_settings():
    env = command_env("--cpu", "--backend", "ddp", "--num-processes", "2", str(PROBE))
    assert not set(env) & set(NCCL_DEBUG_ENV) and env["ACCELKIT_REHEARSAL"] == "ddp"


def test_values_the_user_exported_win():
    assert gpu_debug_env({"TORCH_NCCL_TRACE_BUFFER_SIZE": "50", "TORCH_NCCL_DESYNC_DEBUG": "0"}) == {
        "TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
