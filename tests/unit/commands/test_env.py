"""`accelkit env`: versions, hardware and the default Accelerate config, as text and JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import yaml
from click.testing import CliRunner

from accelkit.cli import cli


def test_json_reports_versions_hardware_and_no_default_config(tmp_path):
    # A real process through main(); at exit it also reports whether deepspeed got imported (it must not be:
    # presence is read from package metadata).
    code = ("import atexit, sys; atexit.register(lambda: print('deepspeed imported:', 'deepspeed' in sys.modules, "
            "file=sys.stderr)); from accelkit.cli import main; main(['env', '--json'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip().endswith("deepspeed imported: False")
    info = json.loads(proc.stdout)
    assert info["python"] == sys.version.split()[0]
    for name in ("torch", "accelerate", "transformers", "datasets", "deepspeed"):
        assert info["versions"][name] == metadata.version(name)
    import torch

    assert info["cuda_available"] == torch.cuda.is_available()
    assert info["gpu_count"] == torch.cuda.device_count() == len(info["gpus"])
    assert info["gloo_available"] is True
    assert info["accelerate_default_config"] == {
        "path": str(tmp_path / "hf" / "accelerate" / "default_config.yaml"), "exists": False, "contents": None}


def test_text_shows_the_default_config_in_effect(tmp_path, monkeypatch):
    from accelerate.commands.config import config_args

    default = tmp_path / "default_config.yaml"
    default.write_text(yaml.safe_dump({"distributed_type": "MULTI_GPU", "num_processes": 4}))
    monkeypatch.setattr(config_args, "default_config_file", str(default))
    result = CliRunner().invoke(cli, ["env"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert f"accelerate default config: {default}" in out
    assert "  distributed_type: MULTI_GPU" in out and "  num_processes: 4" in out
    assert f"accelerate      {metadata.version('accelerate')}" in out
    assert "cuda " in out and "gpus " in out


def test_missing_packages_are_reported(monkeypatch):
    from accelkit import envinfo

    real = metadata.version

    def fake_version(name):
        if name == "deepspeed":
            raise metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(envinfo.metadata, "version", fake_version)
    result = CliRunner().invoke(cli, ["env"])
    assert result.exit_code == 0
    assert "deepspeed       not installed" in result.stdout
    assert json.loads(CliRunner().invoke(cli, ["env", "--json"]).stdout)["versions"]["deepspeed"] is None
