"""Issue #41, closed world: a batch source the converter does not prepare is handled for its idiom or reported with
its line, and the conversion is then partial and says so last, never "converted". Scripts under
tests/data/convert/closed_world/, one per batch-source idiom, each written for this test."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.convert import ConvertRequest, run_convert
from accelkit.convert.codemod import convert_source

SCRIPTS = DATA / "convert" / "closed_world"

# script -> what its batches are reported as: ("handled", a line of the inventory) or ("partial", line, reason)
EXPECTED = {
    "tqdm_loader": ("handled", r"line 11 +dataloader `train_loader`: prepared at line 14"),
    "helper_loader": ("handled", r"line 15 +dataloader `loader`: prepared at line 18"),
    "generator_over_loader": ("handled", r"line 20 +batches +`batches`: from the generator function `batches` "
                                         r"\(line 7\) over a DataLoader of the script, which is prepared"),
    "wrapper_class": ("handled", r"line 31 +batches +`DeviceBatches`: from the iterator class `DeviceBatches` "
                                 r"\(line 7\) over a DataLoader of the script, which is prepared"),
    "generator_over_tensors": ("handled", r"line 20 +batches +`x, y`: sharded by process index before training"),
    "randperm_batches": ("handled", r"line 15 +batches +`inputs, labels`: sharded by process index before training"),
    "iterator_class": ("partial", 30, "takes its batches from `Batches`, a batch iterator class of the script "
                                      "(line 6), not a DataLoader: prepare() cannot shard it"),
    "named_iterator": ("partial", 26, "takes its batches from `ShuffledBatches`, a batch iterator class of the "
                                      "script (line 7), not a DataLoader"),
    "imported_loader": ("partial", 13, "takes its batches from `make_batches(...)` (line 9), code the converter "
                                       "cannot see into"),
}


def _convert(name: str):
    path = SCRIPTS / f"{name}.py"
    return convert_source(path.read_text(), filename=path.name)


def test_every_closed_world_script_has_an_expected_outcome() -> None:
    assert {p.stem for p in SCRIPTS.glob("*.py")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_batch_source_is_handled_or_reported_with_its_line(name: str) -> None:
    result = _convert(name)
    report = result.report.format(f"{name}.py")
    expected = EXPECTED[name]
    compile(result.code, name, "exec")
    if expected[0] == "handled":
        assert not result.report.problems, report
        assert re.search(expected[1], report), report
        assert "NOT sharded" not in report
        return
    _, line, reason = expected
    assert [p.line for p in result.report.problems] == [line], report
    assert reason in result.report.problems[0].what, report
    # the inventory never calls it prepared or sharded
    batches = [f for f in result.report.found if f.line == line and f.kind in ("batches", "dataloader")]
    assert batches and all(f.action.startswith("NOT sharded") for f in batches), batches
    assert "prepared" not in " ".join(f.action for f in batches)


def test_an_iterator_class_named_like_a_loader_is_not_handed_to_prepare() -> None:
    # the silently wrong case of issue #41: `train_loader = ShuffledBatches(...)` went into prepare(), which hands
    # back what is not a DataLoader unchanged, and both ranks trained on all 96 rows
    code = _convert("named_iterator").code
    assert not re.search(r"accelerator\.prepare\([^)]*train_loader", code)


def test_a_dataloader_seen_through_a_progress_bar_is_prepared_and_the_bar_shown_once() -> None:
    code = _convert("tqdm_loader").code
    assert "model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)" in code
    assert "enumerate(tqdm(train_loader, desc=f\"epoch {epoch}\", disable=not accelerator.is_local_main_process))" \
        in code


def test_a_wrapped_dataloader_is_prepared_where_it_is_made_and_its_wrapper_is_not_sharded_again() -> None:
    code = _convert("wrapper_class").code
    assert "DeviceBatches(accelerator.prepare(DataLoader(data, batch_size=8, shuffle=True)), device)" in code
    assert "[shard]" not in code  # the wrapper object is no tensor to slice (a TypeError on 2 ranks)


def test_a_permutation_of_the_indices_is_made_over_each_process_share() -> None:
    # `order = torch.randperm(len(inputs))` indexes the data: sharding it with the data (made later, in the epoch
    # loop) was a NameError; sharding only the data, the order is drawn over the share and every batch keeps its size
    code = _convert("randperm_batches").code
    assert "inputs, labels = inputs[shard], labels[shard]\n" in code
    assert code.index("inputs[shard]") < code.index("order = torch.randperm(len(inputs))")
    assert "order[shard]" not in code


def test_a_permutation_of_a_fixed_length_is_reported_not_sharded() -> None:
    source = (SCRIPTS / "randperm_batches.py").read_text().replace("torch.randperm(len(inputs))",
                                                                  "torch.randperm(80)")
    result = convert_source(source, filename="fixed.py")
    assert [p.line for p in result.report.problems] == [15]
    assert "indexes its batches by `order` (`torch.randperm(80)`, line 14)" in result.report.problems[0].what
    assert "[shard]" not in result.code


def _last_line(result) -> str:
    return [line.text for line in result.lines if not line.err][-1]


def test_a_partial_conversion_says_so_in_its_last_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "iterator_class.py").read_text())
    refused = run_convert(ConvertRequest(script=script))
    assert refused.error is not None and not (tmp_path / "train_accelerate.py").exists()
    written = run_convert(ConvertRequest(script=script, partial=True))
    assert written.error is None and (tmp_path / "train_accelerate.py").exists()
    last = _last_line(written)
    assert last.startswith("partial: line 30: the training loop at line 30 takes its batches from `Batches`"), last
    assert "converted" not in last.lower()


def test_a_complete_conversion_ends_on_its_try_it_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "tqdm_loader.py").read_text())
    result = run_convert(ConvertRequest(script=script))
    assert result.error is None
    assert _last_line(result).startswith("Try it: accelkit launch --cpu --num-processes 2 ")


def test_a_diff_of_a_partial_conversion_ends_its_report_on_the_partial_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text((SCRIPTS / "imported_loader.py").read_text())
    result = run_convert(ConvertRequest(script=script, diff=True))
    errors = [line.text for line in result.lines if line.err]
    assert errors[-1].startswith("partial: line 13: ") and "converted" not in errors[-1].lower()
    assert list(tmp_path.iterdir()) == [script]


def test_a_generator_cutting_its_data_up_to_a_fixed_count_is_reported_not_sharded() -> None:
    # `range(0, 128, size)` in the generator would run past each process's share of 64 rows: empty batches
    source = (SCRIPTS / "generator_over_tensors.py").read_text().replace("range(0, len(x), size)",
                                                                        "range(0, 128, size)")
    result = convert_source(source, filename="fixed.py")
    assert [p.line for p in result.report.problems] == [20]
    assert "with bounds that do not follow the data's length" in result.report.problems[0].what
    assert "[shard]" not in result.code


def test_a_generator_over_a_loader_is_no_evaluation_loop() -> None:
    # its loop over the loader does not train, but it hands the batches to the training loop: `--check` waited for
    # an "evaluation" at line 8 that never comes
    assert _convert("generator_over_loader").report.evaluation_loops == []
