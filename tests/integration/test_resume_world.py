"""Resume on another number of processes: the minimal template checkpointed on 4 CPU ranks resumes on 2, and that
run's checkpoint resumes on 4 again, under FSDP (Accelerate's load_state: DCP's resharding load). The
accumulation changes (1 -> 2 -> 1) so the global batch stays 32, the data position is kept in samples, and the loss
of every step after each resume and the final weights equal the uninterrupted 4-rank run's within 1e-5 (fp32). A
resume on 3 ranks, where no whole accumulation keeps 32, is refused in one line with nothing written.

The runs go through a small wrapper around the template: it turns dropout off (each rank draws its own masks, so two
world sizes never share them) and prints the loss `LogWindow` hands to `accelerator.log` at full precision (the log
line rounds to 4 decimals)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import pytest
from helpers import run_accelkit

from accelkit.scaffold import init_project

EXACT = """
import sys

import train

train.MLPClassifier.__init__.__defaults__ = (16, 64, 4, 0.0)  # in_features, hidden_size, num_classes, dropout


def log_exactly(self, values, step=None, log_kwargs=None):
    if self.is_main_process and "train_loss" in values:
        print(f"EXACT step {step} loss {values['train_loss']!r}", flush=True)


train.Accelerator.log = log_exactly
train.main(sys.argv[1:])
"""
# 128 samples in batches of 32: 4 steps per epoch; 8 steps cross an epoch boundary. The warmup and linear decay make
# the learning rate differ at every step, so a scheduler that did not load would show.
TRAIN_ARGS = ["--per-device-batch-size", "8", "--num-samples", "128", "--max-steps", "8", "--checkpoint-every", "2",
              "--warmup-steps", "2", "--log-every", "1", "--hidden-size", "32", "--resume-from-checkpoint", "latest"]
TOLERANCE = 1e-5
LOSS = re.compile(r"^EXACT step (\d+) loss (\S+)$", re.M)


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    project = init_project(tmp_path_factory.mktemp("resume-world") / "proj", "minimal", backend="ddp").directory
    (project / "exact.py").write_text(EXACT)
    return project


def train(project: Path, backend: str, processes: int, output: str, *extra: str):
    return run_accelkit("launch", "--cpu", "--backend", backend, "--num-processes", str(processes), "exact.py",
                        *TRAIN_ARGS, *extra, "--output-dir", output, cwd=project, timeout=420)


def losses(text: str) -> dict[int, float]:
    return {int(step): float(loss) for step, loss in LOSS.findall(text)}


@pytest.fixture(scope="module")
def uninterrupted(project: Path):
    """The uninterrupted 4-rank run of each backend (checkpoints every 2 steps), run once for the module."""
    runs: dict[str, dict[int, float]] = {}

    def run(backend: str) -> dict[int, float]:
        if backend not in runs:
            proc = train(project, backend, 4, f"{backend}-uninterrupted")
            assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
            runs[backend] = losses(proc.stdout)
            assert sorted(runs[backend]) == list(range(1, 9)), proc.stdout
        return runs[backend]

    return run


def resume_from(project: Path, checkpoint: Path, backend: str, processes: int, output: str) -> str:
    """Resume `checkpoint` (copied into a fresh output directory) on `processes` ranks; its output."""
    import shutil

    shutil.copytree(checkpoint, project / output / checkpoint.name)
    proc = train(project, backend, processes, output)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    return proc.stdout + proc.stderr


def max_weight_difference(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    got, expected = load_file(a / "final" / "model.safetensors"), load_file(b / "final" / "model.safetensors")
    assert got.keys() == expected.keys()
    return max((got[key] - expected[key]).abs().max().item() for key in expected)


# FSDP only: its sharded state reshards through DCP on another world size, which DDP's replicated state does not need;
# the accumulation and data-position arithmetic both share is unit-tested (tests/unit/templates/test_resume_batch.py),
# and DeepSpeed's path in test_zero_resume_on_ranks.py
@pytest.mark.parametrize("backend", ["fsdp"])
def test_a_run_resumes_on_half_then_twice_the_processes_and_ends_as_the_uninterrupted_run(
        project: Path, uninterrupted, backend: str) -> None:
    import json

    expected = uninterrupted(backend)
    reference = project / f"{backend}-uninterrupted"
    # 4 -> 2 ranks, mid-epoch: accumulation 1 -> 2
    halved = resume_from(project, reference / "checkpoint-2", backend, 2, f"{backend}-on-2")
    assert halved.count("resumed from checkpoint-2 (written by 4 processes) on 2: accumulation 1 -> 2 keeps the "
                        "global batch of 32") == 1, halved
    assert "effective batch 32 = 8 per device x 2 processes x 2 accumulation" in halved
    written_on_2 = json.loads((project / f"{backend}-on-2" / "checkpoint-6" / "accelkit-manifest.json").read_text())
    assert (written_on_2["world_size"], written_on_2["gradient_accumulation_steps"],
            written_on_2["global_batch_size"]) == (2, 2, 32)
    # 2 -> 4 ranks, from the checkpoint the 2-rank run wrote in the second epoch: accumulation 2 -> 1
    doubled = resume_from(project, project / f"{backend}-on-2" / "checkpoint-6", backend, 4, f"{backend}-on-4")
    assert doubled.count("resumed from checkpoint-6 (written by 2 processes) on 4: accumulation 2 -> 1 keeps the "
                         "global batch of 32") == 1, doubled

    for output, text, first in ((f"{backend}-on-2", halved, 3), (f"{backend}-on-4", doubled, 7)):
        got = losses(text)
        assert sorted(got) == list(range(first, 9)), text  # every step after the resume, and only those
        loss_difference = max(abs(got[step] - expected[step]) for step in got)
        weight_difference = max_weight_difference(project / output, reference)
        print(f"{output}: max |loss - uninterrupted| {loss_difference:.2e}, max |weight - uninterrupted| "
              f"{weight_difference:.2e}")
        assert loss_difference <= TOLERANCE and weight_difference <= TOLERANCE


def _snapshot(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_world_size_that_cannot_keep_the_global_batch_is_refused_in_one_line(project: Path, uninterrupted) -> None:
    import shutil

    uninterrupted("fsdp")
    output = project / "on-3"
    shutil.copytree(project / "fsdp-uninterrupted" / "checkpoint-2", output / "checkpoint-2")
    before = _snapshot(output)
    proc = train(project, "fsdp", 3, "on-3")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text
    line = ("cannot resume from checkpoint-2 on 3 processes: its global batch of 32 (8 per device x 4 processes x 1 "
            "accumulation) is no whole accumulation of 8 per device x 3 processes; resume on 1, 2 or 4 processes")
    assert [row for row in text.splitlines() if "cannot resume" in row] == [line], text
    assert "Traceback" not in text
    assert _snapshot(output) == before and sorted(p.name for p in output.iterdir()) == ["checkpoint-2"]
