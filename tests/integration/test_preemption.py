"""SIGTERM as a preemption (accelkit.launch.preemption): the first SIGTERM to a plain 2-rank `accelkit launch` of the
minimal template between checkpoints makes the ranks save at the step they stop on and end with status 143; the same
command resumes from that checkpoint to the uninterrupted run's final weights. A second SIGTERM stops at once."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

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
