"""Asynchronous checkpoints in the templates (`--async-checkpoint`, on by default): real 2-rank CPU runs of the
minimal template under DDP and FSDP. A run saving in the background resumes to the weights of an uninterrupted run
that saved synchronously; `accelkit merge-ckpt` reads what it wrote; a rank SIGKILLed while a save is being written
leaves `latest` on the previous complete checkpoint, and the run resumes from it exactly.

The kill is deterministic: the template's test hook ACCELKIT_TEST_CHECKPOINT_WRITE_DELAY=STEP:SECONDS holds the write
of checkpoint-STEP between the model and the optimizer files, and tests/data/restarts/kill_at_step.py SIGKILLs rank 0
(the manifest writer) at the next optimizer step, so the save is in flight when the run dies."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers import DATA
from safetensors.torch import load_file

from accelkit.scaffold import init_project

KILL_AT_STEP = DATA / "restarts" / "kill_at_step.py"
FLAGS = ["--num-samples", "128", "--per-device-batch-size", "16", "--lr-scheduler", "constant", "--warmup-steps", "2",
         "--log-every", "1"]


def launch(project: Path, backend: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "accelkit", "launch", "--backend", backend, "--cpu", "--num-processes", "2", *args]
    return subprocess.run(argv, cwd=project, text=True, capture_output=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def check(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-6000:]}"
    return proc.stdout + proc.stderr


def final(out: Path) -> dict[str, torch.Tensor]:
    return load_file(out / "final" / "model.safetensors")


def assert_close(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=1e-5, msg=name)


def template_module(project: Path):
    spec = importlib.util.spec_from_file_location("minimal_train", project / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return init_project(tmp_path / "proj", "minimal", backend="ddp").directory


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_async_saves_resume_to_the_weights_of_an_uninterrupted_synchronous_run(project: Path, backend: str) -> None:
    check(launch(project, backend, "train.py", "--output-dir", "straight", "--max-steps", "6", "--no-async-checkpoint",
                 *FLAGS))
    first = check(launch(project, backend, "train.py", "--output-dir", "split", "--max-steps", "3",
                         "--checkpoint-every", "1", *FLAGS))
    assert "saves synchronously" not in first
    resumed = check(launch(project, backend, "train.py", "--output-dir", "split", "--max-steps", "6",
                           "--resume-from-checkpoint", "latest", *FLAGS))
    assert "checkpoint-3 at step 3" in resumed
    assert_close(final(project / "split"), final(project / "straight"))

    # Every asynchronous checkpoint is complete (its manifest lists every file) and has save_state's layout.
    import json

    for step in (1, 2, 3, 6):  # the resumed run saves at its end only
        checkpoint = project / "split" / f"checkpoint-{step}"
        manifest = json.loads((checkpoint / "accelkit-manifest.json").read_text())
        listed = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
        assert set(manifest["files"]) == listed - {"accelkit-manifest.json"} and manifest["step"] == step
    layout = {"ddp": {"model.safetensors", "optimizer.bin"},
              "fsdp": {"pytorch_model_fsdp_0/.metadata", "optimizer_0/.metadata"}}[backend]
    assert layout <= set(manifest["files"])

    # merge-ckpt reads the asynchronous FSDP checkpoint: the weights the run ended with.
    if backend == "fsdp":
        from accelkit.merge import MergeOptions
        from accelkit.merge.api import merge_checkpoint

        merged = project / "merged"
        report = merge_checkpoint(MergeOptions(input=checkpoint, output=merged, verify=True, progress=False))
        assert any(line.startswith("manifest accelkit-manifest.json") for line in report.checks), report.checks
        assert_close(load_file(merged / "model.safetensors"), final(project / "split"))


@pytest.mark.parametrize("backend", ["ddp", "fsdp"])
def test_a_sigkill_mid_async_save_leaves_latest_on_the_previous_checkpoint(project: Path, backend: str) -> None:
    straight = launch(project, backend, "train.py", "--output-dir", "straight", "--max-steps", "8", *FLAGS)
    run = ["--output-dir", "out", "--max-steps", "8", "--checkpoint-every", "2", *FLAGS]
    env = {"ACCELKIT_TEST_CHECKPOINT_WRITE_DELAY": "4:120", "KILL_RANK": "0", "KILL_STEP": "5"}
    killed = launch(project, backend, str(KILL_AT_STEP), "train.py", *run, env=env)
    assert killed.returncode != 0
    out = project / "out"
    # The run died while checkpoint-4 was being written: model files there, optimizer files and manifest not.
    model_files = {"ddp": "model.safetensors", "fsdp": "pytorch_model_fsdp_0/.metadata"}[backend]
    optimizer_files = {"ddp": "optimizer.bin", "fsdp": "optimizer_0/.metadata"}[backend]
    assert (out / "checkpoint-4" / model_files).is_file()
    assert not (out / "checkpoint-4" / optimizer_files).exists()
    assert not (out / "checkpoint-4" / "accelkit-manifest.json").exists()
    assert (out / "checkpoint-2" / "accelkit-manifest.json").is_file()
    assert template_module(project).find_checkpoint(out, "latest") == out / "checkpoint-2"

    resumed = check(launch(project, backend, "train.py", *run, "--resume-from-checkpoint", "latest"))
    assert "checkpoint-2 at step 2" in resumed
    check(straight)
    assert_close(final(out), final(project / "straight"))
    assert (out / "checkpoint-4" / "accelkit-manifest.json").is_file()  # rewritten whole by the resumed run
