"""Restarts said out loud (`--max-restarts`): a rank killed by a signal mid-run, the group restarted, the run
resumed from the checkpoint the template finds, each said in one line; the final weights are an uninterrupted
run's. The rank dies inside the script (tests/data/restarts/kill_at_step.py), at a fixed optimizer step of the
first attempt only, so the test does not race the training."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from helpers import DATA, run_accelkit

from accelkit.scaffold import init_project

KILL_AT_STEP = DATA / "restarts" / "kill_at_step.py"
TRAIN_ARGS = ["--max-steps", "40", "--num-samples", "512", "--per-device-batch-size", "8", "--checkpoint-every",
              "10", "--log-every", "10", "--lr-scheduler", "constant", "--warmup-steps", "0"]


def final_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "final" / "model.safetensors")


def test_a_sigkilled_rank_and_the_groups_restart_are_named_and_the_run_resumes_exactly(tmp_path: Path) -> None:
    import torch

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    launch = ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2"]
    reference = subprocess.Popen([sys.executable, "-m", "accelkit", *launch, "train.py", *TRAIN_ARGS,
                                  "--output-dir", "reference"], cwd=project, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True)
    env = {**os.environ, "KILL_RANK": "1", "KILL_STEP": "25", "KILL_SIGNAL": "SIGKILL"}
    # A hang here (seen once in CI: nothing after the kill at step 25, then the test's timeout) is stopped by the
    # watchdog with every rank's stack in the output, instead of by the timeout with nothing to read.
    proc = run_accelkit(*launch, "--max-restarts", "1", "--stall-timeout", "120", str(KILL_AT_STEP), "train.py",
                        *TRAIN_ARGS, "--output-dir", "out", "--resume-from-checkpoint", "latest", cwd=project,
                        env=env, timeout=420)
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out
    text = proc.stderr.replace("\r", "\n")
    assert proc.returncode == 0, text
    # The failure and the restart, in one line: the rank, its signal, the attempt.
    assert re.search(r"accelkit: rank 1 \(pid \d+\) was killed by SIGKILL; restarting every rank: attempt 2 of 2 "
                     r"\(--max-restarts 1\)", text), text
    # The checkpoint the restarted ranks resumed from: checkpoint-20 (saved at step 20, the kill came at 25).
    assert re.search(r"accelkit: attempt 2: the ranks resumed from \S*checkpoint-20 \(step 20\)", text), text
    assert "accelkit: this run took 2 attempt(s):" in text
    assert re.search(r"attempt 1: started; ended: rank 1 \(pid \d+\) was killed by SIGKILL", text), text
    assert re.search(r"attempt 2: resumed from \S*checkpoint-20 \(step 20\); finished", text), text
    resumed, straight = final_weights(project / "out"), final_weights(project / "reference")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


def test_a_run_without_restarts_says_nothing_about_attempts(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    proc = run_accelkit("launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "--max-restarts", "1",
                        "train.py", "--max-steps", "4", "--num-samples", "64", "--output-dir", "out", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "attempt" not in proc.stderr and "restarting" not in proc.stderr
