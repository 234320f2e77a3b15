"""SIGTERM as a preemption (accelkit.launch.preemption): the first SIGTERM to a plain 2-rank `accelkit launch` of the
minimal template between checkpoints makes the ranks save at the step they stop on and end with status 143; the same
command resumes from that checkpoint to the uninterrupted run's final weights. The same save happens when the signal
lands in an evaluation, in data loading or while an asynchronous save is still being written. A second SIGTERM stops
at once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import run_accelkit

from accelkit.scaffold import init_project

LAUNCH = ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2"]
TRAIN_ARGS = ["--max-steps", "160", "--num-samples", "4096", "--per-device-batch-size", "8", "--checkpoint-every",
              "1000", "--log-every", "10", "--lr-scheduler", "constant", "--warmup-steps", "0"]


def final_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "final" / "model.safetensors")


def start(project: Path, output: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "accelkit", *LAUNCH, "train.py", *TRAIN_ARGS, "--output-dir", output,
                             "--resume-from-checkpoint", "latest"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def signal_after(proc: subprocess.Popen, marker: str, signals: list[int], timeout: float = 240) -> str:
    """Read the job's output until a line contains `marker`, send `signals` (0.1 s apart), return all its output."""
    assert proc.stdout is not None
    seen, deadline = [], time.monotonic() + timeout
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            for signum in signals:
                proc.send_signal(signum)
                time.sleep(0.1)
            break
        assert time.monotonic() < deadline, "".join(seen)
    rest, _ = proc.communicate(timeout=timeout)
    return "".join(seen) + rest


def test_sigterm_saves_at_the_step_it_stops_on_and_the_run_resumes_exactly(tmp_path: Path) -> None:
    import torch

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    reference = start(project, "reference")
    text = signal_after(start(project, "out"), "step 20 |", [signal.SIGTERM])
    reference_out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, reference_out
    assert re.search(r"accelkit: SIGTERM: a preemption; asked 2 rank\(s\) to save a checkpoint and stop", text), text
    stopped = re.search(r"stopped on SIGUSR1 after step (\d+) with a checkpoint", text)
    assert stopped, text
    step = int(stopped.group(1))
    assert 20 <= step < 160, text  # between the periodic checkpoints (every 1000 steps: none)
    assert (project / "out" / f"checkpoint-{step}" / "accelkit-manifest.json").is_file()
    assert "accelkit: preempted: the ranks saved a checkpoint and stopped (exit 143)" in text, text
    assert "Traceback" not in text

    resumed = run_accelkit(*LAUNCH, "train.py", *TRAIN_ARGS, "--output-dir", "out", "--resume-from-checkpoint",
                           "latest", cwd=project, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"checkpoint-{step} at step {step}" in resumed.stdout + resumed.stderr
    got, expected = final_weights(project / "out"), final_weights(project / "reference")
    assert got.keys() == expected.keys()
    assert all(torch.allclose(got[key], expected[key], atol=1e-5, rtol=0) for key in expected)


def test_a_second_sigterm_stops_at_once(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    proc = start(project, "out")
    text = signal_after(proc, "step 10 |", [signal.SIGTERM, signal.SIGTERM])
    assert proc.returncode == 143, text
    assert "accelkit: stopped by SIGTERM; every process of the job has exited." in text, text
    assert "preempted:" not in text


# Where the signal lands: a wrapper around the template holds one phase for 3 s after printing a marker, and the
# SIGTERM is sent when the marker appears, so it reaches the ranks inside that phase.
HOLD_A_PHASE = """
import os, sys, time
import train

PHASE = os.environ["HOLD_PHASE"]

def hold():
    print(f"HOLDING {PHASE}", flush=True)
    time.sleep(3)

if PHASE == "evaluation":
    evaluate = train.evaluate
    def slow_evaluate(*args, **kwargs):
        hold()
        return evaluate(*args, **kwargs)
    train.evaluate = slow_evaluate
elif PHASE == "data loading":
    DataLoader, calls = train.DataLoader, [0]
    def slow_loader(*args, shuffle=False, **kwargs):
        if not shuffle:  # the evaluation's loader
            return DataLoader(*args, **kwargs)
        def collate(batch):
            calls[0] += 1
            if calls[0] == 25:
                hold()
            return train.torch.utils.data.default_collate(batch)
        return DataLoader(*args, shuffle=True, collate_fn=collate, **kwargs)
    train.DataLoader = slow_loader
train.main(sys.argv[1:])
"""
HOLD_ARGS = ["--max-steps", "40", "--num-samples", "2048", "--per-device-batch-size", "8", "--log-every", "1",
             "--lr-scheduler", "constant", "--warmup-steps", "0", "--eval-every", "20", "--checkpoint-every", "10"]


@pytest.fixture(scope="module")
def hold_project(tmp_path_factory) -> Path:
    project = init_project(tmp_path_factory.mktemp("hold") / "proj", "minimal", backend="ddp").directory
    (project / "hold.py").write_text(HOLD_A_PHASE)
    reference = run_accelkit(*LAUNCH, "train.py", *HOLD_ARGS, "--output-dir", "reference", cwd=project, timeout=300)
    assert reference.returncode == 0, reference.stdout + reference.stderr
    return project


@pytest.mark.parametrize(("phase", "marker", "env"), [
    ("evaluation", "HOLDING evaluation", {}),
    ("data loading", "HOLDING data loading", {}),
    # checkpoint-10's files are held for 4 s in the background (the async save); the signal lands at step 11.
    ("a save in progress", "step 11 |", {"ACCELKIT_TEST_CHECKPOINT_WRITE_DELAY": "10:4"}),
])
def test_sigterm_in_any_phase_saves_and_the_run_resumes_exactly(hold_project: Path, phase: str, marker: str,
                                                                 env: dict[str, str]) -> None:
    import os

    import torch

    output = "out-" + phase.replace(" ", "-")
    argv = [sys.executable, "-m", "accelkit", *LAUNCH, "hold.py", *HOLD_ARGS, "--output-dir", output]
    proc = subprocess.Popen(argv, cwd=hold_project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "HOLD_PHASE": phase, **env})
    text = signal_after(proc, marker, [signal.SIGTERM])
    assert proc.returncode == 143, text
    stopped = re.search(r"stopped on SIGUSR1 after step (\d+) with a checkpoint", text)
    assert stopped, text
    step = int(stopped.group(1))
    assert 11 <= step < 40, text
    assert (hold_project / output / f"checkpoint-{step}" / "accelkit-manifest.json").is_file()
    if phase == "a save in progress":  # the held save completed too, before the next one began
        assert (hold_project / output / "checkpoint-10" / "accelkit-manifest.json").is_file()
    if phase != "evaluation":  # resuming from a mid-run checkpoint is tested above; once here, where the
        return                 # evaluation's own generator ran between the last step and the save
    resumed = run_accelkit(*LAUNCH, "train.py", *HOLD_ARGS, "--output-dir", output, "--resume-from-checkpoint",
                           "latest", cwd=hold_project, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"checkpoint-{step} at step {step}" in resumed.stdout + resumed.stderr
    got, expected = final_weights(hold_project / output), final_weights(hold_project / "reference")
    assert all(torch.allclose(got[key], expected[key], atol=1e-5, rtol=0) for key in expected)
