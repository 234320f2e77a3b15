"""The templates' shared block "resume-batch": a checkpoint records its batch in the manifest, and a resume on another
number of processes keeps the global batch (per-device batch x data-parallel processes x accumulation) by changing
the accumulation, or refuses in one line naming the numbers; the data position is counted in samples. The real
resumes (4 -> 2 and 2 -> 4 ranks, DDP and FSDP) are in tests/integration/test_resume_world.py."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers import REPO_ROOT

SOURCE = REPO_ROOT / "templates" / "minimal" / "train.py"


def shared_blocks(*names: str) -> dict[str, object]:
    """The template's own code for these blocks, as users run it."""
    text = SOURCE.read_text()
    code = "from __future__ import annotations\nimport hashlib, json\nfrom pathlib import Path\n"
    for name in names:
        start = text.index(f'# >>> shared block "{name}"')
        code += text[start:text.index(f'# <<< shared block "{name}"', start)]
    namespace: dict[str, object] = {}
    exec(code, namespace)  # noqa: S102 - the template's own code
    return namespace


T = shared_blocks("manifest", "resume-batch")
FOUR_RANKS = {"world_size": 4, **T["batch_record"](8, 4, 1)}


def test_the_manifest_records_the_batch_and_merge_ckpt_still_reads_it(tmp_path: Path) -> None:
    from accelkit.merge import manifest

    assert FOUR_RANKS == {"world_size": 4, "per_device_batch_size": 8, "data_parallel_size": 4,
                          "gradient_accumulation_steps": 1, "global_batch_size": 32}
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    T["write_manifest_file"](tmp_path, 10, "run", 4, T["batch_record"](8, 4, 1))
    written = json.loads((tmp_path / "accelkit-manifest.json").read_text())
    assert {key: written[key] for key in FOUR_RANKS} == FOUR_RANKS
    found = manifest.load(tmp_path / "accelkit-manifest.json")
    assert found.step == 10 and found.world_size == 4 and list(found.files) == ["model.safetensors"]


@pytest.mark.parametrize(("manifest", "per_device", "data_parallel", "asked", "expected", "line"), [
    # 4 -> 2 ranks: the run; twice the accumulation keeps 32
    (FOUR_RANKS, 8, 2, 1, 2, "resumed from checkpoint-10 (written by 4 processes) on 2: accumulation 1 -> 2 keeps "
                             "the global batch of 32"),
    # 2 -> 4 ranks of a run that accumulated 2
    ({"world_size": 2, **T["batch_record"](8, 2, 2)}, 8, 4, 2, 1,
     "resumed from checkpoint-10 (written by 2 processes) on 4: accumulation 2 -> 1 keeps the global batch of 32"),
    # 4 -> 1 process, with another per-device batch too
    (FOUR_RANKS, 4, 1, 1, 8, "resumed from checkpoint-10 (written by 4 processes) on 1: per-device batch 8 -> 4, "
                             "accumulation 1 -> 8 keeps the global batch of 32"),
    # another accumulation asked for on the command line is named, not used
    (FOUR_RANKS, 8, 2, 3, 2, "resumed from checkpoint-10 (written by 4 processes) on 2: accumulation 1 -> 2 (not "
                             "the 3 asked for) keeps the global batch of 32"),
    # the same processes and per-device batch: as before, the accumulation asked for and no line
    (FOUR_RANKS, 8, 4, 1, 1, None),
    (FOUR_RANKS, 8, 4, 2, 2, None),
    # a manifest written before the batch was recorded (or none at all): as before
    ({"world_size": 4}, 8, 2, 1, 1, None),
    ({}, 8, 2, 3, 3, None),
])
def test_the_accumulation_keeps_the_global_batch(manifest: dict, per_device: int, data_parallel: int, asked: int,
                                                 expected: int, line: str | None) -> None:
    got = T["resume_accumulation"]("checkpoint-10", manifest, per_device, data_parallel, data_parallel, asked)
    assert got == (expected, line)
    if line is not None:  # what the resumed run steps on is the checkpoint's global batch
        assert per_device * data_parallel * expected == manifest["global_batch_size"]


@pytest.mark.parametrize(("per_device", "processes", "message"), [
    (8, 3, "cannot resume from checkpoint-10 on 3 processes: its global batch of 32 (8 per device x 4 processes x 1 "
           "accumulation) is no whole accumulation of 8 per device x 3 processes; resume on 1, 2 or 4 processes"),
    (8, 8, "cannot resume from checkpoint-10 on 8 processes: its global batch of 32 (8 per device x 4 processes x 1 "
           "accumulation) is no whole accumulation of 8 per device x 8 processes; resume on 1, 2 or 4 processes"),
    (32, 2, "cannot resume from checkpoint-10 on 2 processes: its global batch of 32 (8 per device x 4 processes x 1 "
            "accumulation) is no whole accumulation of 32 per device x 2 processes; resume on 1 process"),
    (5, 2, "cannot resume from checkpoint-10 on 2 processes: its global batch of 32 (8 per device x 4 processes x 1 "
           "accumulation) is no whole accumulation of 5 per device x 2 processes; resume with another "
           "--per-device-batch-size"),
])
def test_no_whole_accumulation_is_refused_in_one_line(per_device: int, processes: int, message: str) -> None:
    with pytest.raises(ValueError) as refusal:
        T["resume_accumulation"]("checkpoint-10", FOUR_RANKS, per_device, processes, processes, 1)
    assert str(refusal.value) == message and "\n" not in message


def test_the_line_names_the_world_size_when_only_some_processes_are_data_parallel() -> None:
    # causal-lm under tensor parallelism: 4 processes, 2 of them data-parallel (tp 2), written by 8 (dp 4)
    manifest = {"world_size": 8, **T["batch_record"](8, 4, 1)}
    assert T["resume_accumulation"]("checkpoint-3", manifest, 8, 2, 4, 1) == (
        2, "resumed from checkpoint-3 (written by 8 processes) on 4: accumulation 1 -> 2 keeps the global batch of 32")


@pytest.mark.parametrize(("samples", "per_device", "data_parallel", "batches"), [
    (0, 8, 4, 0),
    (64, 8, 4, 2),  # 2 steps of 32 on 4 ranks: 2 batches each
    (64, 8, 2, 4),  # the same samples on 2 ranks: 4 batches each, none seen twice or skipped
    (64, 4, 1, 16),
])
def test_the_batches_to_skip_are_the_samples_consumed(samples: int, per_device: int, data_parallel: int,
                                                      batches: int) -> None:
    assert T["batches_to_skip"](samples, per_device, data_parallel) == batches


def test_samples_that_are_no_whole_number_of_batches_are_refused() -> None:
    with pytest.raises(ValueError, match="48 samples into the epoch is not a whole number of batches of 8 per device "
                                         "x 4 processes"):
        T["batches_to_skip"](48, 8, 4)


class _Accelerator:
    """What keep_global_batch uses of an Accelerator."""

    def __init__(self, num_processes: int, accumulation: int, main: bool = True, deepspeed: dict | None = None) -> None:
        self.num_processes, self.gradient_accumulation_steps, self.is_main_process = num_processes, accumulation, main
        plugin = None if deepspeed is None else SimpleNamespace(deepspeed_config=deepspeed)
        self.state = SimpleNamespace(deepspeed_plugin=plugin)


def _checkpoint(tmp_path: Path, manifest: dict | None) -> Path:
    checkpoint = tmp_path / "checkpoint-10"
    checkpoint.mkdir()
    if manifest is not None:
        (checkpoint / "accelkit-manifest.json").write_text(json.dumps(manifest))
    return checkpoint


def test_keep_global_batch_sets_the_accumulation_before_prepare(tmp_path: Path) -> None:
    accelerator = _Accelerator(2, 1)
    line = T["keep_global_batch"](accelerator, _checkpoint(tmp_path, FOUR_RANKS), 8, 2)
    assert accelerator.gradient_accumulation_steps == 2 and line.endswith("keeps the global batch of 32")


def test_keep_global_batch_sets_deepspeeds_own_accumulation(tmp_path: Path) -> None:
    """Under DeepSpeed the engine accumulates by its config's value, which prepare() keeps over the Accelerator's:
    a ZeRO checkpoint of 4 ranks resumed on 2 (through its universal copy) would step at half the batch."""
    config = {"gradient_accumulation_steps": 1, "train_batch_size": "auto"}
    accelerator = _Accelerator(2, 1, deepspeed=config)
    assert T["keep_global_batch"](accelerator, _checkpoint(tmp_path, FOUR_RANKS), 8, 2) is not None
    assert accelerator.gradient_accumulation_steps == 2 and config["gradient_accumulation_steps"] == 2


@pytest.mark.parametrize("manifest", [None, {"world_size": 4}])
def test_keep_global_batch_leaves_older_checkpoints_as_they_were(tmp_path: Path, manifest: dict | None) -> None:
    accelerator = _Accelerator(2, 3)
    assert T["keep_global_batch"](accelerator, _checkpoint(tmp_path, manifest), 8, 2) is None
    assert T["keep_global_batch"](accelerator, None, 8, 2) is None
    assert accelerator.gradient_accumulation_steps == 3


def test_keep_global_batch_refuses_once_from_the_main_process(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, FOUR_RANKS)
    with pytest.raises(SystemExit) as main:
        T["keep_global_batch"](_Accelerator(3, 1, main=True), checkpoint, 8, 3)
    with pytest.raises(SystemExit) as other:
        T["keep_global_batch"](_Accelerator(3, 1, main=False), checkpoint, 8, 3)
    assert str(main.value.code).startswith("cannot resume from checkpoint-10 on 3 processes: its global batch of 32")
    assert other.value.code == 1  # a non-zero exit that prints nothing: the line is said once
