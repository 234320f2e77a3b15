"""How `convert --check` judges what the probes recorded: the alignment rules and tolerances, on hand-made records
(the real runs are in tests/integration/test_convert_check.py)."""

from __future__ import annotations

from accelkit.convert.check.invariants import (
    FAIL,
    PASS,
    SKIP,
    Runs,
    learning_rates,
    metrics,
    samples,
    side_effects,
    weights,
    wrapped,
)
from accelkit.convert.check.record import Pass, Record, Step


def _steps(lrs: list[float], per_epoch: int, world_len: int | None = None) -> list[Step]:
    """One step per batch, `per_epoch` batches per epoch, learning rates as given."""
    return [Step(number=i + 1, optimizer=0, is_clock=True, lrs=[lr], digest="d", progress=[0, i // per_epoch,
                                                                                           i % per_epoch + 1,
                                                                                           world_len or per_epoch])
            for i, lr in enumerate(lrs)]


def _runs(original: Record, ranks: list[Record], iteration_based: bool = False) -> Runs:
    return Runs(original, ranks, len(ranks), iteration_based)


def test_learning_rates_are_compared_at_the_same_point_of_training() -> None:
    # the original: 8 batches per epoch; an epoch scheduler with gamma 0.5 -> lr 1.0 in epoch 1, 0.5 in epoch 2
    original = Record(steps=_steps([1.0] * 8 + [0.5] * 8, per_epoch=8))
    good = Record(steps=_steps([1.0] * 4 + [0.5] * 4, per_epoch=4))  # 4 batches per epoch on each of 2 ranks
    assert learning_rates(_runs(original, [good, good])).status == PASS
    twice_as_fast = Record(steps=_steps([1.0] * 4 + [0.25] * 4, per_epoch=4))  # the scheduler prepared
    verdict = learning_rates(_runs(original, [twice_as_fast, twice_as_fast]))
    assert verdict.status == FAIL and "used lr 0.25 on 2 processes; the original used 0.5" in verdict.summary
    assert "(epoch 2, batch 1 of 8; here batch 1 of 4 on each process)" in verdict.summary
    # a per-batch schedule prepared (stepped twice per call) lines up with the original's odd steps
    per_batch = [1.0 - i / 16 for i in range(16)]
    prepared = Record(steps=_steps(per_batch[::2], per_epoch=4))
    assert learning_rates(_runs(Record(steps=_steps(per_batch, per_epoch=8)), [prepared, prepared])).status == PASS
    not_prepared = Record(steps=_steps(per_batch[:8], per_epoch=4))
    assert learning_rates(_runs(Record(steps=_steps(per_batch, 8)), [not_prepared] * 2)).status == FAIL


def test_without_epochs_random_batches_compare_step_by_step() -> None:
    lrs = [0.1 * (i + 1) for i in range(8)]
    original = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs)])
    same_per_step = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs[:4])])
    assert learning_rates(_runs(original, [same_per_step] * 2, iteration_based=True)).status == PASS
    assert learning_rates(_runs(original, [same_per_step] * 2, iteration_based=False)).status == FAIL


def test_weights_must_match_on_every_rank_and_the_cause_is_named() -> None:
    a = Record(rank=0, steps=[Step(1, 0, True, [1.0], "aaa", before="x")])
    b = Record(rank=1, steps=[Step(1, 0, True, [1.0], "bbb", before="y")])
    verdict = weights(_runs(Record(), [a, b]))
    assert verdict.status == FAIL and "started from different weights" in verdict.summary
    assert verdict.evidence == ("rank 0: aaa", "rank 1: bbb")
    b.steps[0] = Step(1, 0, True, [1.0], "aaa", before="x")
    assert weights(_runs(Record(), [a, b])).status == PASS


def test_an_unwrapped_optimizer_names_the_variable() -> None:
    owner = "`model` (Net) in `Trainer.run` (train.py:57)"
    rank0 = Record(steps=[Step(1, 0, True, [1.0], "d")], optimizers=["AdamW"],
                   unwrapped=[{"optimizer": 0, "kind": "AdamW", "tensors": 4, "numel": 1234, "owners": [owner]}])
    verdict = wrapped(_runs(Record(), [rank0, rank0]))
    assert verdict.status == FAIL and owner in verdict.evidence[0] and "1,234 values" in verdict.evidence[0]
    assert wrapped(_runs(Record(), [Record()])).status == SKIP


def _pass(indices: list[int], complete: bool = True, steps: int = 2, length: int = 10, batch: int = 2) -> Pass:
    return Pass(loader=0, number=0, length=-1, dataset_length=length, batch_size=batch, indices=indices,
                batches=len(indices) // batch, steps=steps, complete=complete)


def test_samples_once_per_epoch_with_room_only_for_the_padding_of_an_uneven_split() -> None:
    original = Record(passes=[_pass(list(range(10)))])
    sharded = [Record(rank=0, passes=[_pass([0, 1, 4, 5, 8, 9])]), Record(rank=1, passes=[_pass([2, 3, 6, 7])])]
    assert samples(_runs(original, sharded)).status == PASS
    # 9 samples, batch 2, 2 ranks: Accelerate repeats sample 0 to even out the last batch
    padded = [Record(rank=0, passes=[_pass([0, 1, 4, 5, 8, 0], length=9)]),
              Record(rank=1, passes=[_pass([2, 3, 6, 7], length=9)])]
    assert samples(_runs(Record(passes=[_pass(list(range(9)), length=9)]), padded)).status == PASS
    unsharded = [Record(rank=r, passes=[_pass(list(range(10)))]) for r in range(2)]
    verdict = samples(_runs(original, unsharded))
    assert verdict.status == FAIL and "seen by more than one rank" in verdict.summary
    missing = [Record(rank=0, passes=[_pass([0, 1, 4, 5])]), Record(rank=1, passes=[_pass([2, 3, 6, 7])])]
    assert "never seen" in samples(_runs(original, missing)).summary
    truncated = [Record(rank=r, passes=[_pass([0, 1], complete=False)]) for r in range(2)]
    assert samples(_runs(original, truncated)).status == FAIL  # the same batch on both ranks, even mid-epoch


def test_a_look_at_the_first_batch_before_prepare_is_not_a_pass_to_shard() -> None:
    """Every rank read the same first batch of the loader not yet sharded (an ActNorm init), then trained on its
    shards: samples PASS and say so; a look that differs between the ranks, or a whole epoch alike, is not one."""
    def look(indices: list[int], complete: bool = False) -> Pass:
        return Pass(loader=0, number=0, length=-1, dataset_length=10, batch_size=2, indices=indices,
                    complete=complete)

    def train(indices: list[int]) -> Pass:
        return Pass(loader=0, number=1, length=-1, dataset_length=10, batch_size=2, indices=indices, steps=3,
                    complete=True)
    ranks = [Record(rank=r, world=2, role="converted", passes=[look([0, 1]), train(shard)])
             for r, shard in enumerate(([0, 1, 4, 5, 8, 9], [2, 3, 6, 7]))]
    verdict = samples(_runs(Record(), ranks))
    assert verdict.status == PASS, verdict.summary
    assert "the same batches of loader #0 read alike by every rank, without training" in verdict.summary
    ranks[1].passes[0] = look([0, 1, 2, 3])
    assert samples(_runs(Record(), ranks)).status == FAIL
    for record in ranks:
        record.passes[0] = look(list(range(10)), complete=True)
    assert samples(_runs(Record(), ranks)).status == FAIL  # a whole evaluation epoch on every rank: not sharded


def test_samples_without_a_dataloader_compare_the_inputs_of_each_step() -> None:
    same = [Record(rank=r, step_inputs=["a", "b", "c", "d"], fingerprints={"x": 4}) for r in range(2)]
    verdict = samples(_runs(Record(), same))
    assert verdict.status == FAIL and "at 4 of 4 steps every rank trained on the same inputs" in verdict.summary
    split = [Record(rank=0, step_inputs=["a", "b", "c", "d"]), Record(rank=1, step_inputs=["e", "f", "g", "a"])]
    verdict = samples(_runs(Record(), split))
    assert verdict.status == PASS and "different inputs at 4 of 4 steps" in verdict.summary


def test_hand_made_batches_that_overlap_across_ranks_fail_samples() -> None:
    # issue #31 (token streams): ranks that train on different inputs at every step can still train on the same
    # samples (the data reordered or offset per rank, not split): caught when the rows identify samples
    def rank(number: int, *steps: range) -> Record:
        rows = [[f"r{i}" for i in step] for step in steps]
        return Record(rank=number, step_inputs=[f"s{step.start}" for step in steps], step_rows=rows)

    offset = [rank(0, range(0, 4), range(4, 8)), rank(1, range(2, 6), range(6, 10))]
    verdict = samples(_runs(Record(), offset))
    assert verdict.status == FAIL and "6 of the 10 distinct training samples" in verdict.summary
    assert samples(_runs(Record(), [rank(0, range(0, 4), range(4, 8)),
                                    rank(1, range(8, 12), range(12, 16))])).status == PASS
    # the next epoch of unshuffled data feeds the same steps again: counted once
    again = [rank(0, range(0, 4), range(4, 8), range(0, 4)), rank(1, range(2, 6), range(6, 10), range(2, 6))]
    assert samples(_runs(Record(), again)).status == FAIL
    assert samples(_runs(Record(), [rank(0, range(0, 10)), rank(1, range(9, 19))])).status == PASS  # 1 of 19
    # a row fed at two different steps of one rank: rows are no sample identities (a small vocabulary)
    recurring = [rank(0, range(0, 4), range(3, 7)), rank(1, range(2, 6), range(6, 10))]
    assert samples(_runs(Record(), recurring)).status == PASS
    assert samples(_runs(Record(), offset, iteration_based=True)).status == PASS  # random batches may meet


def _evaluated(lines: list[str], returned=None, replayed: bool = True) -> Record:
    record = Record(passes=[Pass(0, 0, 4, 16, 4, list(range(16)), batches=4, steps=0, complete=True,
                                 owner="train.py:test")],
                    lines=[["0:0:end", "train.py:test", line] for line in lines], replayed=["0:0"] if replayed else [])
    if returned is not None:
        record.returns = {"0:0": returned}
    return record


def test_metrics_after_an_evaluation_pass_match_with_the_printed_precision() -> None:
    original = _evaluated(["EVAL loss=1.422650 correct=6/16 took 3.2s"], returned=0.71)
    close = _evaluated(["EVAL loss=1.422651 correct=6/16 took 9.9s"], returned=0.7100001)
    assert metrics(_runs(original, [close])).status == PASS  # last digit and durations do not count
    halved = _evaluated(["EVAL loss=0.711325 correct=6/16 took 3.2s"], returned=0.71)
    verdict = metrics(_runs(original, [halved]))
    assert verdict.status == FAIL and "0.711325 on `EVAL loss` where one process prints 1.422650" in verdict.summary
    wrong_return = _evaluated(["EVAL loss=1.422650 correct=6/16 took 3.2s"], returned=0.355)
    assert "returned 0.355 where one process returns 0.71" in metrics(_runs(original, [wrong_return])).summary
    assert metrics(_runs(_evaluated([], replayed=False), [close])).status == SKIP


def test_side_effects_one_writer_per_file_and_output_on_the_main_process() -> None:
    rank0 = Record(rank=0, files={"model.pt": 1, "loss.png": 1})
    rank1 = Record(rank=1, files={"loss.png": 1})
    verdict = side_effects(_runs(Record(), [rank0, rank1]))
    assert verdict.status == FAIL and "loss.png written by ranks 0, 1" in verdict.evidence
    chatty = Record(rank=1, stdout_lines=3, lines=[["", "train.py:main", "LOSS 0.1"]])
    assert "rank 1 printed 3 line(s) from train.py:main" in side_effects(_runs(Record(), [rank0, chatty])).evidence[0]
    assert side_effects(_runs(Record(files={"model.pt": 1}), [rank0, Record(rank=1)])).status == PASS


def test_output_of_code_the_conversion_cannot_gate_counts_only_when_the_original_does_not_print_it() -> None:
    # nanoGPT: its model.py (a module beside the script, not converted) prints "number of parameters" on every
    # process, as the original does under torchrun; an exec'd configurator prints before the Accelerator exists
    original = Record(lines=[["", "train.py:<module>", "Overriding: batch_size = 4"],
                             ["", "model.py:GPT.__init__", "number of parameters: 0.03M"]])
    rank0 = Record(rank=0)
    quiet_here = Record(rank=1, unedited_lines=[["before its Accelerator existed", "Overriding: batch_size = 4"],
                                                ["model.py", "number of parameters: 0.03M"]])
    verdict = side_effects(_runs(original, [rank0, quiet_here]))
    assert verdict.status == PASS, verdict
    assert "the converted code's output on the main process only" in verdict.summary
    assert any("1 line(s) printed on the other ranks from model.py" in e for e in verdict.evidence)
    assert any("before its Accelerator existed" in e for e in verdict.evidence)
    added = Record(rank=1, unedited_lines=[["model.py", "rank 1 ready"]])  # not the original's output
    verdict = side_effects(_runs(original, [rank0, added]))
    assert verdict.status == FAIL and "rank 1 printed 1 line(s) the original does not print" in verdict.evidence[0]


def test_an_evaluation_the_step_limit_stopped_before_fails_with_the_steps_that_reach_it() -> None:
    """16 batches per epoch on each rank, stopped at 8 steps: the evaluation after the epoch comes at step 17."""
    stopped = Record(steps=_steps([0.1] * 8, per_epoch=16), reason="step limit")
    original = Record(steps=_steps([0.1] * 16, per_epoch=32), reason="step limit")
    runs = Runs(original, [stopped, stopped], 2, False, evaluation_loops=(9,), steps=8)
    verdict = metrics(runs)
    assert verdict.status == FAIL and verdict.fix == "--steps 17", verdict
    assert "the script evaluates (loop at line 9)" in verdict.summary and "8 step(s)" in verdict.summary
    every = metrics(Runs(original, [stopped, stopped], 2, False, evaluation_loops=(9,), steps=8,
                         evaluation_every=(500,)))  # makemore: `step % 500 == 0`, its epoch 10**10 samples long
    assert every.status == FAIL and every.fix == "--steps 501" and "every 500 training steps" in every.evidence[0]
    ended = Record(steps=_steps([0.1] * 8, per_epoch=16), reason="script end")  # evaluation not run with these args
    assert metrics(Runs(original, [ended, ended], 2, False, evaluation_loops=(9,), steps=8)).status == SKIP
    assert "no evaluation loop" in metrics(Runs(original, [stopped, stopped], 2, False, steps=8)).summary


def test_a_converted_run_without_a_training_step_fails_when_the_original_trained() -> None:
    trained = Record(steps=_steps([0.1] * 4, per_epoch=4))
    idle = Record()
    verdict = wrapped(_runs(trained, [idle, idle]))
    assert verdict.status == FAIL and "reached no training step" in verdict.summary and "took 4" in verdict.summary
    assert wrapped(_runs(Record(), [idle, idle])).status == SKIP  # nothing trained anywhere: `ran` fails for it


def test_full_batch_training_sees_all_the_data_on_every_rank() -> None:
    # issue #31: a graph trained on all of its nodes every step is right when every rank trains on the same input
    from dataclasses import replace

    same = [Record(rank=r, step_inputs=["g", "g", "g", "g"], fingerprints={"g": 4}) for r in range(2)]
    verdict = samples(replace(_runs(Record(), same), full_batch=True))
    assert verdict.status == PASS and "full batch" in verdict.summary
    cut = [Record(rank=0, step_inputs=["a", "b", "c", "d"]), Record(rank=1, step_inputs=["e", "f", "g", "h"])]
    assert samples(replace(_runs(Record(), cut), full_batch=True)).status == FAIL


def test_samples_drawn_with_replacement_may_repeat_across_ranks() -> None:
    # issue #31: makemore's InfiniteDataLoader, RandomSampler(replacement=True): a sample drawn on both ranks is the
    # sampler's doing, not a missing shard
    from dataclasses import replace

    original = Record(passes=[replace(_pass([3, 3, 7, 1, 0, 9, 9, 2, 5, 4]), replacement=True)])
    drawn = [Record(rank=0, passes=[replace(_pass([3, 1, 9, 9]), replacement=True)]),
             Record(rank=1, passes=[replace(_pass([3, 5, 0, 2]), replacement=True)])]
    assert samples(_runs(original, drawn)).status == PASS


def test_the_probe_finds_a_sampler_with_replacement_inside_a_loader() -> None:
    import torch

    from accelkit.convert.check.probe_data import _with_replacement

    data = torch.utils.data.TensorDataset(torch.ones(8, 1))
    sampler = torch.utils.data.RandomSampler(data, replacement=True, num_samples=100)
    assert _with_replacement(torch.utils.data.DataLoader(data, sampler=sampler, batch_size=2))
    assert not _with_replacement(torch.utils.data.DataLoader(data, shuffle=True, batch_size=2))


def test_metrics_of_an_evaluation_that_draws_random_numbers_are_equal_up_to_the_draw() -> None:
    # pytorch/examples' VAE samples in its forward: the 2-process test loss differs from the one-process one by the
    # draw (547.1439 vs 547.2408); counting the padded last round twice (729.9626) is still a FAIL
    original = _evaluated(["====> Test set loss: 547.2408"])
    original.passes[0].draws = True
    verdict = metrics(_runs(original, [_evaluated(["====> Test set loss: 547.1439"])]))
    assert verdict.status == PASS and "1 evaluation pass(es) draw random numbers: equal within 2%" in verdict.summary
    verdict = metrics(_runs(original, [_evaluated(["====> Test set loss: 729.9626"])]))
    assert verdict.status == FAIL and "729.9626 on `Test set loss` where one process prints 547.2408" in \
        verdict.summary
    original.passes[0].draws = False  # a deterministic evaluation keeps the tight comparison
    assert metrics(_runs(original, [_evaluated(["====> Test set loss: 547.1439"])])).status == FAIL


PROBED_PASSES = """
import torch
from torch.utils.data import DataLoader, TensorDataset
from accelkit.convert.check.probe_data import LoaderTracker
from accelkit.convert.check.record import Record

record = Record()
tracker = LoaderTracker(record, lambda: None, lambda p: None, lambda p: None)
tracker.hook_torch()
loader = DataLoader(TensorDataset(torch.ones(8, 2)), batch_size=4)
for (x,) in loader:  # deterministic: only the loader's own seed is drawn, before the pass
    y = x * 2
for (x,) in loader:  # a forward that samples (a VAE's reparameterization)
    y = x + torch.randn_like(x)
print([p.draws for p in record.passes])
"""


def test_the_probe_tells_an_evaluation_that_draws_random_numbers() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", PROBED_PASSES], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[False, True]", proc.stdout + proc.stderr


def test_a_script_that_keeps_its_global_batch_fixed_is_compared_step_for_step() -> None:
    # build-nanogpt: grad_accum_steps = total_batch_size // (B * T * world): 2 backward passes a step on 1
    # process, 1 on each of 2 ranks, so the conversion's step k is the original's step k (a warm-up lr per step)
    lrs = [0.1 * (i + 1) for i in range(8)]
    original = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs)], backward_passes=16)
    fixed = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs[:4])], backward_passes=4)
    verdict = learning_rates(_runs(original, [fixed, fixed]))
    assert verdict.status == PASS, verdict.summary
    # the same accumulation on every process: the global batch grows with N, step k is the original's 2k - 1
    grows = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs[::2])], backward_passes=8)
    assert learning_rates(_runs(original, [grows, grows])).status == PASS
    wrong = Record(steps=[Step(i + 1, 0, True, [lr], "d") for i, lr in enumerate(lrs[:4])], backward_passes=8)
    verdict = learning_rates(_runs(original, [wrong, wrong]))
    assert verdict.status == FAIL and "(its step 3)" in verdict.summary
    # a full batch (a graph, an LBFGS closure over the whole tensor): every step of the conversion is the original's
    full = Runs(original, [fixed, fixed], 2, False, full_batch=True)
    assert learning_rates(full).status == PASS
    wrong_full = Runs(Record(steps=original.steps), [grows, grows], 2, False, full_batch=True)
    assert learning_rates(wrong_full).status == FAIL


def test_a_sparse_model_input_is_fingerprinted_by_its_rows() -> None:
    # pytorch/examples' gcn: the features of a graph as a sparse COO tensor; the probe's `.contiguous()` raised
    # "unsupported memory format option Contiguous" in the original, and the check blamed the original
    import torch

    from accelkit.convert.check.probe_data import fingerprint_rows

    dense = torch.tensor([[0.0, 1.0], [2.0, 0.0], [0.0, 1.0]])
    from_sparse = fingerprint_rows(Record(), (dense.to_sparse(),))
    assert from_sparse == fingerprint_rows(Record(), (dense,))
    assert from_sparse[0] == from_sparse[2] != from_sparse[1]


def test_an_evaluation_drawing_from_python_random_or_numpy_counts_as_random() -> None:
    # pytorch/examples' siamese test set picks each pair's partner with `random.randint` in `__getitem__`: the
    # check looked at torch's generator only and compared its metrics to the last digit (a false FAIL)
    import random

    import numpy

    from accelkit.convert.check.probe_data import rng_digest

    start = rng_digest()
    assert rng_digest() == start
    random.randint(0, 9)
    after_random = rng_digest()
    assert after_random != start
    numpy.random.rand()
    assert rng_digest() != after_random


def test_a_dataset_that_draws_in_getitem_draws_the_same_per_index_and_pass_in_any_order() -> None:
    # pytorch/examples' siamese test set: one process and each of N processes fetch the samples in other orders;
    # drawn from the running stream, the pairs differed (23 against 24 correct of 24: a false metrics FAIL)
    import random

    from torch.utils.data import DataLoader, Dataset

    from accelkit.convert.check.probe_data import _draw_per_sample

    class Pairs(Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, index):
            return index, random.randint(0, 10**9)

    passes = [0]
    forward, backward = Pairs(), Pairs()
    _draw_per_sample(DataLoader(forward), forward, lambda: passes[0])
    _draw_per_sample(DataLoader(backward), backward, lambda: passes[0])
    random.seed(1)
    before = random.getstate()
    first = {i: forward[i][1] for i in range(6)}
    assert random.getstate() == before  # the script's own stream goes on as if nothing was drawn
    assert {i: backward[i][1] for i in reversed(range(6))} == first
    passes[0] = 1  # the next epoch draws other pairs, the same in every run
    again = {i: forward[i][1] for i in range(6)}
    assert again != first and again == {i: backward[i][1] for i in range(6)}
    assert isinstance(forward, Pairs) and type(forward).__name__ == "Pairs"
