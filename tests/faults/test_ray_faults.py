"""`accelkit launch --ray`'s refusals that come before Ray is asked anything: options that do not go with it,
Ray not installed, an address that is not one. Each: exit code, one line, nothing written. (The refusals that need a
cluster — too few CPUs, no cluster at the address — are in tests/integration/test_ray_target.py.)"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers.faults import invoke_fault, run_fault


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('never runs')\n")
    return path


@pytest.mark.parametrize(("extra", "words"), [
    (["--slurm", "job.sbatch"], "--ray and --slurm cannot be combined"),
    (["--stall-timeout", "60"], "--stall-timeout does not apply with --ray"),
    (["--lost-timeout", "10"], "--lost-timeout does not apply with --ray"),
    (["--rdzv-backend", "c10d"], "--rdzv-backend does not apply with --ray"),
    (["--num-machines", "2"], "--num-machines does not apply with --ray"),
    (["--main-process-ip", "10.0.0.1"], "--main-process-ip does not apply with --ray"),
])
def test_options_that_do_not_go_with_ray_are_usage_errors(tmp_path: Path, script: Path, extra: list[str],
                                                           words: str) -> None:
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", "--ray", "127.0.0.1:6379", *extra, str(script)],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(words, exit_code=2, hint=False)


@pytest.mark.parametrize("flag", [["--ray-storage", "store"], ["--ray-cpus-per-worker", "2"]])
def test_ray_companions_without_ray_are_usage_errors(tmp_path: Path, script: Path, flag: list[str]) -> None:
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", *flag, str(script)], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(f"{flag[0]} only applies with --ray ADDRESS", exit_code=2, hint=False)


def test_an_address_that_is_not_host_port_is_refused(tmp_path: Path, script: Path) -> None:
    result = run_fault(["launch", "--cpu", "--num-processes", "2", "--ray", "headnode", str(script)],
                       watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("--ray 'headnode' is not HOST:PORT or auto")


def test_ray_not_installed_is_one_line_with_the_install_command(tmp_path: Path, script: Path) -> None:
    """A `ray` that cannot be imported, first on the path, stands for a machine without Ray."""
    shadow = tmp_path / "shadow"
    (shadow / "ray").mkdir(parents=True)
    (shadow / "ray" / "__init__.py").write_text("raise ImportError('No module named ray')\n")
    env = {"PYTHONPATH": os.pathsep.join(p for p in (str(shadow), os.environ.get("PYTHONPATH", "")) if p)}
    result = run_fault(["launch", "--cpu", "--num-processes", "2", "--ray", "auto", str(script)], watch=[script],
                       cwd=tmp_path, env=env)
    line = result.assert_refused("--ray needs Ray Train, which is not installed here")
    assert 'pip install "ray[train]"' in result.stderr, line
