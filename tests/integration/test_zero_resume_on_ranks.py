"""A DeepSpeed ZeRO checkpoint written by N CPU ranks resumes on M through `accelkit launch` (DeepSpeed's universal
checkpoint, converted by launch before the ranks start) and ends where the uninterrupted N-rank run ends: ZeRO-2
4 -> 2 and ZeRO-3 2 -> 4.

The minimal template, started from one saved model without dropout (dropout draws per-rank random numbers, which
differ when the ranks do), trains 8 steps on N ranks with a checkpoint every 4. Its checkpoint-4 is copied into a
second output folder and resumed there on M ranks by the same command (per-device batch 8; the first run
accumulates 32 / (8 x N) micro-batches, set by launch's --gradient-accumulation-steps, which DeepSpeed's config
carries): the template changes the accumulation to keep the global batch of 32, in DeepSpeed's config too, and says
so in one line. The final fp32 masters (DeepSpeed's own
zero_to_fp32 on each run's checkpoint-8) agree within 1e-5, the losses logged after the resume are the
uninterrupted run's, the one line is printed and the original checkpoint is untouched.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import torch
from helpers import run_accelkit, tree_hash

from accelkit.scaffold import init_project

LOSS = re.compile(r"step (\d+) \| loss ([0-9.]+)")
COMMON = ["--num-samples", "256", "--max-steps", "8", "--checkpoint-every", "4", "--log-every", "1"]


def _train(project: Path, zero: int, ranks: int, accumulation: int, out: Path, *extra: str):
    proc = run_accelkit("launch", "--cpu", "--backend", "deepspeed", "--zero-stage", str(zero), "--num-processes",
                        str(ranks), "--gradient-accumulation-steps", str(accumulation), "train.py", "--model",
                        str(project / "init"), *COMMON, "--per-device-batch-size", "8", "--output-dir", str(out),
                        *extra,
                        cwd=project, env={"OMP_NUM_THREADS": "1"}, timeout=420)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return proc


def _losses(text: str) -> dict[int, str]:
    return {int(step): loss for step, loss in LOSS.findall(text)}


def _masters(checkpoint: Path) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))


# (ZeRO stage, ranks that write the checkpoint, ranks that resume it): both directions, both stages, two runs each.
# CI runs the case (ZeRO-2 written by 4, resumed on 2); ZeRO-1 and ZeRO-3 in both directions were measured with
# this test by hand (docs/guides/resuming-zero.md): each case is four DeepSpeed launches, CI's time is short.
@pytest.mark.parametrize(("zero", "written_by", "resumed_on"), [(2, 4, 2)])
def test_a_zero_checkpoint_resumes_on_another_world_size_and_ends_equal(tmp_path: Path, zero: int, written_by: int,
                                                                        resumed_on: int) -> None:
    project = init_project(tmp_path / "project", "minimal", backend="ddp").directory
    spec = importlib.util.spec_from_file_location("minimal_train", project / "train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    torch.manual_seed(0)
    module.MLPClassifier(16, 64, 4, dropout=0.0).save_pretrained(str(project / "init"))

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    accumulation = 32 // (8 * written_by)  # a global batch of 32
    first = _train(project, zero, written_by, accumulation, straight)
    assert f"effective batch 32 = 8 per device x {written_by} processes x {accumulation} accumulation" in first.stdout
    resumed.mkdir()
    shutil.copytree(straight / "checkpoint-4", resumed / "checkpoint-4")
    before = tree_hash(resumed / "checkpoint-4")
    # the same command on another number of processes
    second = _train(project, zero, resumed_on, accumulation, resumed, "--resume-from-checkpoint", "latest")
    kept = 32 // (8 * resumed_on)
    assert (f"resumed from checkpoint-4 (written by {written_by} processes) on {resumed_on}: accumulation "
            f"{accumulation} -> {kept}") in second.stdout, second.stdout
    assert f"effective batch 32 = 8 per device x {resumed_on} processes x {kept} accumulation" in second.stdout

    copy = resumed / "checkpoint-4-universal"
    assert (f"accelkit: checkpoint-4 was written by {written_by} ZeRO-{zero} ranks; resuming on {resumed_on} from its "
            f"universal copy {copy} (converting it now, with DeepSpeed's ds_to_universal)") in second.stderr
    assert f"resumed from {copy / 'checkpoint-4'} at step 4" in second.stdout + second.stderr
    assert tree_hash(resumed / "checkpoint-4") == before  # converted beside the original, never in place
    assert not [p.name for p in resumed.iterdir() if p.name.startswith(".")]  # no staging folder left

    want, got = _masters(straight / "checkpoint-8"), _masters(resumed / "checkpoint-8")
    assert sorted(want) == sorted(got)
    worst = max((want[k] - got[k]).abs().max().item() for k in want)
    print(f"ZeRO-{zero} {written_by} -> {resumed_on} ranks: max |difference| of the final fp32 masters {worst:.3g}")
    assert worst <= 1e-5
    assert any((want[k] - _masters(straight / "checkpoint-4")[k]).abs().max() > 1e-3 for k in want)  # it trained
    after = _losses(second.stdout + second.stderr)
    assert sorted(after) == list(range(5, 9))
    assert after == {s: v for s, v in _losses(first.stdout + first.stderr).items() if s > 4}
