"""`convert --check`'s newer comparisons on hand-made records: metrics printed by the evaluation's caller (only the
numbers traced to the evaluation), IterableDataset epochs compared by content, and the FSDP wording of the verdicts
(the real runs are in tests/integration/test_convert_check.py)."""

from __future__ import annotations

from types import SimpleNamespace

from accelkit.convert.check.invariants import FAIL, PASS, Runs, metrics, samples, weights, wrapped
from accelkit.convert.check.probe_metrics import CallerMetrics, numbers_in, shows
from accelkit.convert.check.record import Pass, Record, Step


def _frame(**variables) -> SimpleNamespace:
    return SimpleNamespace(f_locals=variables)


# -- which numbers of a caller's line are the evaluation's ------------------------------------------------------
def test_a_printed_number_shows_a_value_to_the_digits_printed() -> None:
    assert shows("0.6128", 0.61283) and shows("0.6128", 0.61276) and not shows("0.6128", 0.6131)
    assert shows("3", 3.2) and not shows("3", 3.6)
    assert shows("1.23e-05", 1.2304e-5) and not shows("1.23e-05", 1.3e-5)
    assert not shows("nan", float("nan"))


def test_numbers_are_read_from_results_dicts_dataclasses_and_0d_values_but_not_strings() -> None:
    from dataclasses import dataclass

    @dataclass
    class Result:
        loss: float
        accuracy: float

    found = numbers_in({"result": Result(0.5, 0.75), "log": {"val": 0.25, "name": "x"}, "flag": True, "s": "1.0"})
    assert sorted(found) == [0.25, 0.5, 0.75]


def test_the_callers_figures_from_before_the_evaluation_are_not_its_metrics() -> None:
    callers = CallerMetrics()
    # at the start of the evaluation pass: the loop (innermost) and its caller, holding the epoch and training loss
    callers.pass_started([_frame(total=0.0), _frame(epoch=1, train_loss=0.6965, start=1.7e9)])
    after = _frame(epoch=1, train_loss=0.6965, start=1.7e9, result={"loss": 0.4457, "acc": 0.8056})
    line = "| end of epoch   1 | time:  0.37s | train loss 0.6965 | valid loss 0.4457 | valid acc 0.8056"
    assert callers.positions(line, after) == [3, 4]  # valid loss, valid acc: not the epoch, time or train loss
    assert callers.positions("test ppl 1.5615", after) == []  # computed in the print itself: no variable shows it
    assert callers.positions("anything 0.4457", None) == []


def _evaluated(lines: list[list], owner: str = "train.py:evaluate") -> Record:
    return Record(passes=[Pass(1, 0, 4, 16, 4, list(range(16)), batches=4, steps=0, complete=True, owner=owner)],
                  lines=lines, replayed=["1:0"])


def test_a_callers_line_is_compared_on_the_evaluations_numbers_only() -> None:
    def line(train: str, val: str) -> list:
        return ["1:0:end", "train.py:main", f"epoch 1 train loss {train} val loss {val}", [2]]

    original = _evaluated([line("0.6639", "0.6363")])
    same_metric = _evaluated([line("0.6965", "0.6363")])  # the training loss differs: legitimately
    verdict = metrics(Runs(original, [same_metric], 2, False))
    assert verdict.status == PASS and verdict.summary.startswith("1 metric(s)"), verdict
    halved = _evaluated([line("0.6965", "0.3181")])
    verdict = metrics(Runs(original, [halved], 2, False))
    assert verdict.status == FAIL, verdict
    assert "printed by its caller: 0.3181 on `val loss` where one process prints 0.6363" in verdict.summary
    # a caller's line without a metric of the evaluation, or differing in words (a path), is not compared
    quiet = ["1:0:end", "train.py:main", "saved /tmp/a/ckpt-1.pt", []]
    other_words = ["1:0:end", "train.py:main", "saved /tmp/b/ckpt-1.pt", []]
    assert metrics(Runs(_evaluated([quiet]), [_evaluated([other_words])], 2, False)).status != FAIL


# -- IterableDataset epochs, by content -------------------------------------------------------------------------
def _stream(rows: list[str], complete: bool = True, steps: int = 2) -> Pass:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row] = counts.get(row, 0) + 1
    return Pass(loader=0, number=0, length=-1, dataset_length=-1, batch_size=2, batches=len(rows) // 2,
                steps=steps, complete=complete, stream=True, rows=counts)


def _stream_runs(original: list[str] | None, ranks: list[list[str]], complete: bool = True) -> Runs:
    one = Record(passes=[_stream(original)]) if original is not None else Record()
    return Runs(one, [Record(rank=r, passes=[_stream(rows, complete)]) for r, rows in enumerate(ranks)], len(ranks),
                False)


def test_a_stream_epoch_is_sharded_when_every_sample_is_taken_once() -> None:
    epoch = [f"s{i}" for i in range(8)]
    verdict = samples(_stream_runs(epoch, [epoch[0::2], epoch[1::2]]))
    assert verdict.status == PASS, verdict
    assert "IterableDataset loader #0 (training, samples compared by content): 1 epoch(s): every sample of the " \
           "one-process epoch taken, each by one rank" in verdict.summary


def test_a_stream_every_rank_reads_whole_fails_and_a_missed_sample_fails() -> None:
    epoch = [f"s{i}" for i in range(8)]
    verdict = samples(_stream_runs(epoch, [epoch, epoch]))
    assert verdict.status == FAIL and "8 sample(s) taken by more than one rank" in verdict.summary, verdict
    assert "(IterableDataset), epoch 1" in verdict.summary
    verdict = samples(_stream_runs(epoch, [epoch[0:2], epoch[2:4]]))
    assert verdict.status == FAIL and "4 of 8 sample(s) of the epoch taken by no rank" in verdict.summary, verdict


def test_the_padding_of_an_uneven_last_batch_is_allowed_and_said() -> None:
    epoch = [f"s{i}" for i in range(7)]  # 7 samples, batch 2, 2 ranks: one repeated to fill the last batch
    verdict = samples(_stream_runs(epoch, [epoch[0:2] + epoch[4:6], epoch[2:4] + epoch[6:7] + epoch[0:1]]))
    assert verdict.status == PASS and "(1 taken again to even out the last batch)" in verdict.summary, verdict


def test_what_cannot_be_checked_of_a_stream_is_said_not_claimed() -> None:
    epoch = [f"s{i}" for i in range(8)]
    unfinished = samples(_stream_runs(epoch, [epoch[0:2], epoch[2:4]], complete=False))
    assert unfinished.status == PASS
    assert "1 epoch(s): no sample taken by two ranks (the converted run stopped within the epoch: missed samples " \
           "not checked)" in unfinished.summary
    assert "every sample" not in unfinished.summary
    random = samples(_stream_runs(epoch, [["r1", "r2"], ["r3", "r4"]]))
    assert "no sample taken by two ranks (its samples differ from the one-process run's, e.g. drawn at random: " \
           "missed samples not checked)" in random.summary
    alone = samples(_stream_runs(None, [epoch[0::2], epoch[1::2]]))
    assert "(the one-process run did not finish this epoch: missed samples not checked)" in alone.summary


# -- FSDP ------------------------------------------------------------------------------------------------------
def test_under_fsdp_the_verdicts_name_sharding_and_gathered_weights() -> None:
    step = [Step(1, 0, True, [1.0], "full", before="x")]
    ranks = [Record(rank=r, backend="fsdp", steps=step, optimizers=["AdamW"], wrapped=["Net"]) for r in range(2)]
    runs = Runs(Record(), ranks, 2, False)
    assert wrapped(runs).summary == "every trained module is sharded by FSDP (fully_shard): Net, 1 optimizer(s)"
    assert weights(runs).summary.endswith("(full parameters gathered from the FSDP shards)")
    bare = [Record(rank=r, backend="fsdp", steps=step, optimizers=["AdamW"], unwrapped=[
        {"optimizer": 0, "kind": "AdamW", "tensors": 2, "numel": 10, "owners": ["`model` (Net) in `main`"]}])
        for r in range(2)]
    verdict = wrapped(Runs(Record(), bare, 2, False))
    assert verdict.status == FAIL and "that no FSDP shards: `model` (Net)" in verdict.evidence[0]
    assert wrapped(Runs(Record(), [Record(rank=r, backend="fsdp", steps=step) for r in range(2)], 2, False)).summary \
        == "no module was wrapped by FSDP"


def test_the_library_refuses_a_backend_the_check_does_not_rehearse(tmp_path) -> None:
    import pytest

    from accelkit.convert.check.run_check import CheckOptions, check_script
    from accelkit.errors import AccelkitError

    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    with pytest.raises(AccelkitError, match="--check rehearses ddp or fsdp, not 'deepspeed'"):
        check_script(script, [], CheckOptions(backend="deepspeed"), workdir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]  # refused before anything was made
