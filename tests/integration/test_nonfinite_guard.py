"""The templates' non-finite guard on 2 real CPU ranks (minimal template, DDP): a NaN loss on one rank at one step
skips that optimizer step on every rank, names the step in one line, and the run goes on with finite weights; NaN at
--max-nonfinite-steps steps in a row stops the run (exit 1, one line) with a checkpoint of the last finite weights.
Under DeepSpeed (ZeRO-2), which steps inside backward, its own check of the global gradient norm skips the step and
the guard names and counts it. The NaN comes from the template's test hook ACCELKIT_TEST_NONFINITE_LOSS=RANK:STEP,..."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file

from accelkit.scaffold import init_project

FLAGS = ["--num-samples", "128", "--per-device-batch-size", "16", "--lr-scheduler", "constant", "--warmup-steps", "2",
         "--log-every", "1", "--checkpoint-every", "1"]


def launch(project: Path, nonfinite: str, *args: str, backend: tuple[str, ...] = ("--backend", "ddp")
           ) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "accelkit", "launch", *backend, "--cpu", "--num-processes", "2",
            "train.py", *FLAGS, *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "ACCELKIT_TEST_NONFINITE_LOSS": nonfinite}
    return subprocess.run(argv, cwd=project, text=True, capture_output=True, timeout=300, env=env)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return load_file(checkpoint / "model.safetensors")


def assert_finite(state: dict[str, torch.Tensor]) -> None:
    for name, tensor in state.items():
        assert torch.isfinite(tensor).all(), name


def test_a_nan_loss_on_one_rank_skips_that_step_everywhere_and_the_run_goes_on(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    proc = launch(project, "1:3", "--output-dir", "out", "--max-steps", "5")  # rank 1's loss is NaN at step 3
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    lines = [line for line in text.replace("\r", "\n").splitlines() if "non-finite" in line]
    assert lines == ["step 3: non-finite loss or gradient norm; optimizer step skipped on every rank (1 in a row, "
                     "1 in this run)"], lines
    out = project / "out"
    for step in range(1, 6):
        assert_finite(weights(out / f"checkpoint-{step}"))
    assert_finite(load_file(out / "final" / "model.safetensors"))
    # Step 3 changed nothing (weights and optimizer state as after step 2); the steps around it did.
    before, skipped, after = (weights(out / f"checkpoint-{s}") for s in (2, 3, 4))
    assert all(torch.equal(before[k], skipped[k]) for k in before)
    assert not all(torch.equal(skipped[k], after[k]) for k in after)
    optimizer = [torch.load(out / f"checkpoint-{s}" / "optimizer.bin", weights_only=True) for s in (2, 3)]
    assert optimizer[0]["state"][0]["step"] == optimizer[1]["state"][0]["step"] == 2


def test_nan_at_k_steps_in_a_row_stops_the_run_with_the_last_finite_weights(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    proc = launch(project, "0:3,4,5", "--output-dir", "out", "--max-steps", "8", "--max-nonfinite-steps", "3")
    text = (proc.stdout + proc.stderr).replace("\r", "\n")
    assert proc.returncode != 0, text
    assert ("stopped: 3 optimizer steps in a row had a non-finite loss or gradient norm (to step 5); checkpoint-5 "
            "holds the last finite weights") in text
    out = project / "out"
    assert sorted(p.name for p in out.iterdir()) == [f"checkpoint-{s}" for s in range(1, 6)]  # no final model
    assert json.loads((out / "checkpoint-5" / "accelkit-manifest.json").read_text())["step"] == 5
    last_finite, stopped = weights(out / "checkpoint-2"), weights(out / "checkpoint-5")
    assert_finite(stopped)
    assert all(torch.equal(last_finite[k], stopped[k]) for k in last_finite)


def test_under_deepspeed_zero2_its_skip_of_the_nan_step_is_named_and_the_weights_stay_finite(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="deepspeed").directory
    proc = launch(project, "1:3", "--output-dir", "out", "--max-steps", "4",
                  backend=("--backend", "deepspeed", "--zero-stage", "2"))
    text = (proc.stdout + proc.stderr).replace("\r", "\n")
    assert proc.returncode == 0, text[-4000:]
    assert "[deepspeed] OVERFLOW! Skipping step." in text  # DeepSpeed's own line
    assert [line for line in text.splitlines() if "non-finite" in line and line.startswith("step")] == [
        "step 3: non-finite loss or gradient norm; optimizer step skipped on every rank (1 in a row, 1 in this run)"]
    merged = {}
    for step in (2, 3, 4):  # the fp32 weights DeepSpeed's optimizer holds, merged by merge-ckpt
        target = tmp_path / f"merged-{step}"
        checkpoint = project / "out" / f"checkpoint-{step}"
        merge = subprocess.run([sys.executable, "-m", "accelkit", "merge-ckpt", str(checkpoint), "-o", str(target)],
                               text=True, capture_output=True, timeout=300)
        assert merge.returncode == 0, merge.stderr[-3000:]
        merged[step] = load_file(target / "model.safetensors")
        assert_finite(merged[step])
    assert all(torch.equal(merged[2][key], merged[3][key]) for key in merged[2])
    assert not all(torch.equal(merged[3][key], merged[4][key]) for key in merged[3])
