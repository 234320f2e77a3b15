"""`convert --check` against the original at the global batch (issue #41): how `weights` judges the equivalence
run's record and the weight differences, on hand-made records; the weight files compared with real tensors; the
sum-reduced loss scaled by the conversion. (The real runs: tests/integration/test_convert_check_equivalence.py.)"""

from __future__ import annotations

from pathlib import Path

import torch

from accelkit.convert.check.equivalence import Equivalence, StepDifference, compare_weights
from accelkit.convert.check.invariants import FAIL, PASS, Runs, weights
from accelkit.convert.check.record import WEIGHTS_FILE, Record, Step
from accelkit.convert.codemod import convert_source


def _ranks(steps: int = 3) -> list[Record]:
    """Two ranks, `steps` steps of optimizer #0, rows a0,a1 on rank 0 and b0,b1 on rank 1 at every step."""
    return [Record(rank=r, steps=[Step(i + 1, 0, True, [0.1], "same") for i in range(steps)], optimizers=["SGD"],
                   step_rows=[[f"{'ab'[r]}{i}-0", f"{'ab'[r]}{i}-1"] for i in range(steps)]) for r in range(2)]


def _original(steps: int = 3, **changes) -> Record:
    record = Record(steps=[Step(i + 1, 0, True, [0.1], "x") for i in range(steps)], optimizers=["SGD"],
                    step_rows=[[f"a{i}-0", f"b{i}-0", f"a{i}-1", f"b{i}-1"] for i in range(steps)],
                    batch_scaled=[[2, 4]])
    for key, value in changes.items():
        setattr(record, key, value)
    return record


def _judge(original: Record, differences: list[float], failure: str = "") -> tuple[str, str]:
    found = Equivalence(original, failure, tuple(StepDifference(i, d, "Net.fc.weight")
                                                 for i, d in enumerate(differences)))
    verdict = weights(Runs(None, _ranks(), 2, False, equivalence=found))
    return verdict.status, verdict.summary


def test_weights_equal_to_the_originals_at_the_global_batch_pass_and_say_what_was_compared() -> None:
    status, summary = _judge(_original(), [1e-7, 2e-7, 3e-7])
    assert status == PASS
    assert "equal to the original's within 0.0001 relative after 3 of 3 step(s)" in summary
    assert "DataLoader batch set by the check to 4 (2 per rank), against the conversion on 2 ranks" in summary


def test_a_step_off_by_more_than_the_tolerance_fails_naming_the_step_and_the_parameter() -> None:
    status, summary = _judge(_original(), [1e-7, 0.5, 0.6])
    assert status == FAIL
    assert summary.startswith("after step 2 the weights differ from the original's on 1 process at the global "
                              "batch: Net.fc.weight by 0.5 relative (tolerance 0.0001)")


def test_what_cannot_be_equal_is_not_compared_and_says_why() -> None:
    cases = {
        "it did not run there (exit status 1: RuntimeError: shape": (_original(), "exit status 1: RuntimeError: "
                                                                                   "shape"),
        "no DataLoader with a batch size": (_original(batch_scaled=[]), ""),
        "BatchNorm1d normalises over each process's own batch": (_original(batch_norm=["BatchNorm1d"]), ""),
        "the training step draws random numbers": (_original(step_draws=[True, True, True]), ""),
        "its first step trained on other samples": (_original(step_rows=[["z"]] * 3), ""),
    }
    for words, (original, failure) in cases.items():
        status, summary = _judge(original, [0.5] * 3, failure)
        assert status == PASS and "not compared with the original on 1 process at the global batch" in summary
        assert words in summary, summary


def test_only_the_steps_on_the_same_samples_are_compared() -> None:
    original = _original()
    original.step_rows[2] = ["other"]  # the third step trained on other samples (a reshuffled epoch)
    status, summary = _judge(original, [1e-7, 1e-7, 0.5])
    assert status == PASS and "after 2 of 3 step(s)" in summary


def test_the_weight_files_are_compared_parameter_by_parameter(tmp_path: Path) -> None:
    ours, theirs = tmp_path / "converted", tmp_path / "original"
    ours.mkdir(), theirs.mkdir()
    weight, bias = torch.tensor([1.0, 2.0, 4.0]), torch.tensor([0.5])
    torch.save({0: {"Net.w": weight, "Net.b": bias}, 1: {"Net.w": weight, "Net.b": bias * 2}}, ours / WEIGHTS_FILE)
    torch.save({0: {"Net.w": weight, "Net.b": bias}, 1: {"Net.w": weight + 1e-3, "Net.b": bias}},
               theirs / WEIGHTS_FILE)
    first, second = compare_weights(ours, theirs)
    assert (first.position, first.relative) == (0, 0.0)
    assert second.parameter == "Net.b" and abs(second.relative - 1.0) < 1e-9  # 1.0 - 0.5 over 0.5
    assert compare_weights(ours, tmp_path / "nothing") == ()


SUMMED = """import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

model = nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(list(range(8)), batch_size=2)
criterion = {criterion}
for x, y in loader:
    optimizer.zero_grad()
    loss = {loss}
    loss.backward()
    optimizer.step()
"""


def _backward_line(criterion: str, loss: str) -> str:
    code = convert_source(SUMMED.format(criterion=criterion, loss=loss)).code
    return next(line.strip() for line in code.splitlines() if "accelerator.backward(" in line)


def test_a_sum_reduced_loss_is_scaled_by_the_number_of_processes_and_only_that() -> None:
    scaled = "accelerator.backward(loss * accelerator.num_processes)"
    assert _backward_line('nn.MSELoss(reduction="sum")', "criterion(model(x), y)") == scaled
    assert _backward_line("None", "F.l1_loss(model(x), y, reduction='sum')") == scaled
    plain = "accelerator.backward(loss)"
    assert _backward_line("nn.MSELoss()", "criterion(model(x), y)") == plain
    assert _backward_line('nn.MSELoss(reduction="mean")', "criterion(model(x), y)") == plain
    # a sum divided by the batch is a mean again
    assert _backward_line('nn.MSELoss(reduction="sum")', "criterion(model(x), y) / len(x)") == plain
    code = convert_source(SUMMED.format(criterion='nn.MSELoss(reduction="sum")', loss="criterion(model(x), y)")).code
    assert "# a loss summed over the batch (reduction='sum'): DDP/FSDP average the gradients" in code


def test_the_equivalence_run_replays_the_ranks_batches_of_each_step_together() -> None:
    from accelkit.convert.check.record import Pass, replay_order

    def rank(indices: list[int], steps: int = 3) -> Record:
        return Record(passes=[Pass(loader=0, number=0, length=3, dataset_length=12, batch_size=2, indices=indices,
                                   steps=steps),
                              Pass(loader=1, number=0, length=1, dataset_length=4, batch_size=2, indices=[0, 1],
                                   complete=True)])
    # shuffled: rank 0 took [5, 1], [7, 3], [0, 9]; rank 1 [2, 8], [4, 6], [11, 10] (a prefetched batch left over)
    order = replay_order([rank([5, 1, 7, 3, 0, 9]), rank([2, 8, 4, 6, 11, 10, 3, 3])])
    assert order == {"0:0": [[5, 1, 2, 8], [7, 3, 4, 6], [0, 9, 11, 10]]}  # the evaluation pass is not replayed


def test_a_look_at_the_first_batch_before_prepare_is_replayed_at_the_scripts_batch() -> None:
    """An ActNorm init reads the first batch of the loader not yet sharded, alike on every rank: the equivalence run
    reads that batch too, not the first batch at N times the batch size (other statistics, other initial weights)."""
    from accelkit.convert.check.record import Pass, replay_order

    def rank(train: list[int]) -> Record:
        return Record(passes=[Pass(loader=0, number=0, length=8, dataset_length=64, batch_size=8,
                                   indices=list(range(8))),
                              Pass(loader=0, number=1, length=4, dataset_length=64, batch_size=8, indices=train,
                                   steps=4, complete=True)])
    order = replay_order([rank([*range(0, 8), *range(16, 24)]), rank([*range(8, 16), *range(24, 32)])])
    assert order == {"0:0": [list(range(8))], "0:1": [list(range(16)), list(range(16, 32))]}
    # the ranks read other batches (the loader sharded before the look): not a look, not replayed
    other = rank([])
    other.passes[0].indices = list(range(8, 16))
    assert "0:0" not in replay_order([rank([]), other])


def test_steps_at_another_learning_rate_than_the_global_batch_run_are_not_compared() -> None:
    original = _original()
    original.steps[1].lrs = [0.05]  # a warm-up counted in steps: elsewhere at twice the batch
    status, summary = _judge(original, [1e-7, 0.5, 0.5])
    assert status == PASS and "after 1 of 3 step(s)" in summary
    assert "from step 2 on the learning rate differs from the one process's at the global batch" in summary
