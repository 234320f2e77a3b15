"""launch's reading of a ZeRO checkpoint before any rank starts (accelkit.launch.zero_resume): which checkpoint the
script resumes from, its world size and stage, what launch says it will do, and the one-line refusals (nothing
written). The conversion itself and the resumed run are tests/integration/test_zero_resume.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import tree_hash

from accelkit.errors import AccelkitError
from accelkit.launch import zero_resume as zr
from accelkit.merge.zero_world import read_zero_checkpoint


def zero_checkpoint(path: Path, ranks: int = 4, stage: int = 2, manifest_world: int | None = None,
                    skip_rank: int | None = None) -> Path:
    """A save_state folder with DeepSpeed's layout: `latest` naming the tag folder, one optimizer state per rank."""
    tag = path / "pytorch_model"
    tag.mkdir(parents=True)
    (path / "latest").write_text("pytorch_model")
    (path / "random_states_0.pkl").write_bytes(b"rng")
    for rank in range(ranks):
        if rank != skip_rank:
            torch.save({"optimizer_state_dict": {"zero_stage": stage, "partition_count": ranks}},
                       tag / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    model_states = [f"zero_pp_rank_{r}_mp_rank_00_model_states.pt" for r in range(ranks)] if stage == 3 else [
        "mp_rank_00_model_states.pt"]
    for name in model_states:
        torch.save({"module": {}}, tag / name)
    if manifest_world is not None:
        (path / zr.MANIFEST_NAME).write_text(json.dumps({"world_size": manifest_world, "step": 10}))
    return path


def test_the_script_options_are_read_and_rewritten_as_argparse_reads_them() -> None:
    args = ("--output-dir", "out", "--resume-from-checkpoint=latest", "--seed", "1")
    assert zr.script_option(args, "--resume-from-checkpoint") == "latest"
    assert zr.script_option(args, "--output-dir") == "out"
    assert zr.script_option(("--seed", "1"), "--resume-from-checkpoint") is None
    assert zr.with_script_option(args, "--resume-from-checkpoint", "/c") == (
        "--output-dir", "out", "--resume-from-checkpoint=/c", "--seed", "1")
    assert zr.with_script_option(("--resume-from-checkpoint", "latest"), "--resume-from-checkpoint", "/c") == (
        "--resume-from-checkpoint", "/c")


def test_latest_is_the_newest_complete_checkpoint_as_the_templates_pick_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    for step in (5, 10, 20):
        (out / f"checkpoint-{step}").mkdir(parents=True)
    for step in (5, 10):
        (out / f"checkpoint-{step}" / zr.MANIFEST_NAME).write_text("{}")
    (out / "checkpoint-30-universal").mkdir()  # a universal copy is never "latest"
    args = ("--resume-from-checkpoint", "latest", "--output-dir", str(out))
    assert zr.resume_checkpoint(args, tmp_path / "train.py") == out / "checkpoint-10"  # 20 has no manifest
    assert zr.resume_checkpoint(("--resume-from-checkpoint", str(out / "checkpoint-5")), tmp_path) == \
        out / "checkpoint-5"
    assert zr.resume_checkpoint(("--resume-from-checkpoint", "latest"), tmp_path / "train.py") is None  # no outputs/


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_layout_gives_world_size_and_stage(tmp_path: Path, stage: int) -> None:
    found = read_zero_checkpoint(zero_checkpoint(tmp_path / "checkpoint-10", ranks=4, stage=stage,
                                                    manifest_world=4))
    assert (found.tag, found.world_size, found.stage) == ("pytorch_model", 4, stage)


def test_folders_without_zero_rank_files_are_not_deepspeed_checkpoints(tmp_path: Path) -> None:
    ddp = tmp_path / "checkpoint-1"
    ddp.mkdir()
    (ddp / "model.safetensors").write_bytes(b"")
    assert read_zero_checkpoint(ddp) is None
    universal = tmp_path / "checkpoint-2"
    (universal / "pytorch_model" / "zero").mkdir(parents=True)
    (universal / "latest").write_text("pytorch_model")
    assert read_zero_checkpoint(universal) is None


def test_the_plan_says_what_it_will_do_and_writes_nothing(tmp_path: Path) -> None:
    checkpoint = zero_checkpoint(tmp_path / "out" / "checkpoint-10", ranks=4, manifest_world=4)
    args = ("--output-dir", str(tmp_path / "out"), "--resume-from-checkpoint", "latest")
    before = tree_hash(tmp_path / "out")
    assert zr.plan_zero_resume(args, tmp_path / "train.py", 4) is None  # the same world size: DeepSpeed loads it
    plan = zr.plan_zero_resume(args, tmp_path / "train.py", 2, dry_run=True)
    copy = tmp_path / "out" / "checkpoint-10-universal"
    assert plan.copy == copy / "checkpoint-10" and plan.converted
    assert plan.line == (f"checkpoint-10 was written by 4 ZeRO-2 ranks; resuming on 2 from its universal copy {copy} "
                         "(a dry run: not converted yet, with DeepSpeed's ds_to_universal)")
    assert tree_hash(tmp_path / "out") == before and checkpoint.is_dir()
    # A copy an earlier launch made is reused.
    (copy / "checkpoint-10" / "pytorch_model" / "zero").mkdir(parents=True)
    (copy / "checkpoint-10" / "pytorch_model" / zr.UNIVERSAL_MARKER).write_bytes(b"")
    again = zr.plan_zero_resume(args, tmp_path / "train.py", 2)
    assert not again.converted and "(converted by an earlier launch" in again.line
    # The copy given by hand is loaded as what it is, on any world size.
    (copy / "checkpoint-10" / "latest").write_text("pytorch_model")
    direct = zr.plan_zero_resume(("--resume-from-checkpoint", str(copy / "checkpoint-10")), tmp_path, 4)
    assert direct.copy == copy / "checkpoint-10" and not direct.converted
    assert direct.line == f"{copy / 'checkpoint-10'} is a DeepSpeed universal checkpoint: the ranks load it with " \
                          "load_universal"


def test_a_missing_rank_file_is_refused_in_one_line(tmp_path: Path) -> None:
    checkpoint = zero_checkpoint(tmp_path / "checkpoint-10", ranks=4, skip_rank=2)
    with pytest.raises(AccelkitError, match=r"optimizer-state file of rank 2 is missing .*found ranks \[0, 1, 3\]"):
        zr.plan_zero_resume(("--resume-from-checkpoint", str(checkpoint)), tmp_path / "train.py", 2)


def test_a_manifest_of_another_world_size_is_refused(tmp_path: Path) -> None:
    checkpoint = zero_checkpoint(tmp_path / "checkpoint-10", ranks=4, manifest_world=8)
    with pytest.raises(AccelkitError, match="manifest says 8 processes wrote it, but .* holds 4 ranks'") as caught:
        zr.plan_zero_resume(("--resume-from-checkpoint", str(checkpoint)), tmp_path / "train.py", 2)
    assert "one save" in caught.value.hint


def test_a_damaged_manifest_is_refused(tmp_path: Path) -> None:
    checkpoint = zero_checkpoint(tmp_path / "checkpoint-10", ranks=4)
    (checkpoint / zr.MANIFEST_NAME).write_text('{"world_size": 4')
    with pytest.raises(AccelkitError, match="accelkit-manifest.json is not a readable manifest"):
        zr.plan_zero_resume(("--resume-from-checkpoint", str(checkpoint)), tmp_path / "train.py", 2)


def test_a_folder_in_the_copys_place_is_refused_not_replaced(tmp_path: Path) -> None:
    checkpoint = zero_checkpoint(tmp_path / "checkpoint-10", ranks=4)
    (tmp_path / "checkpoint-10-universal").mkdir()
    (tmp_path / "checkpoint-10-universal" / "notes.txt").write_text("mine")
    with pytest.raises(AccelkitError, match="checkpoint-10-universal exists but holds no universal copy"):
        zr.plan_zero_resume(("--resume-from-checkpoint", str(checkpoint)), tmp_path / "train.py", 2)
    assert (tmp_path / "checkpoint-10-universal" / "notes.txt").read_text() == "mine"


def test_a_converter_failure_leaves_nothing(tmp_path: Path) -> None:
    """DeepSpeed's converter refusing (here: model states it cannot read) is one line; no copy or staging folder."""
    checkpoint = zero_checkpoint(tmp_path / "checkpoint-10", ranks=2)
    plan = zr.plan_zero_resume(("--resume-from-checkpoint", str(checkpoint)), tmp_path / "train.py", 1)
    with pytest.raises(AccelkitError, match="DeepSpeed's ds_to_universal could not convert"):
        zr.make_universal_copy(plan)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10"]


@pytest.mark.parametrize("given_json", [False, True])
def test_the_ranks_get_the_same_deepspeed_settings_plus_load_universal(tmp_path: Path, given_json: bool) -> None:
    """Inline settings become the JSON `--deepspeed-json` writes for them; a JSON the user gave keeps every key."""
    from accelkit.configs import ConfigOptions
    from accelkit.launch.build_plan import resolve_request, with_load_universal
    from accelkit.launch.launch_plan import LaunchTarget
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest(target=LaunchTarget("train.py"), cpu=True,
                            options=ConfigOptions(backend="deepspeed", zero_stage=3, num_processes=2))
    if given_json:  # an Accelerate config naming the user's DeepSpeed JSON
        user = tmp_path / "ds.json"
        user.write_text(json.dumps({"zero_optimization": {"stage": 3, "reduce_bucket_size": 1000},
                                    "checkpoint": {"tag_validation": "FAIL"}, "train_batch_size": "auto"}))
        (tmp_path / "config.yaml").write_text(
            "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 2\n"
            f"deepspeed_config:\n  deepspeed_config_file: {user}\n")
        before = user.read_text()
        request = LaunchRequest(target=LaunchTarget("train.py"), cpu=True, config_file=tmp_path / "config.yaml")
    config = with_load_universal(request, resolve_request(request), tmp_path / "launch" / "universal.json")
    content = dict(config.deepspeed.json_content)
    assert config.deepspeed.json_file == str(tmp_path / "launch" / "universal.json")
    assert content["zero_optimization"]["stage"] == 3 and content["checkpoint"]["load_universal"] is True
    if given_json:
        assert content["zero_optimization"]["reduce_bucket_size"] == 1000
        assert content["checkpoint"]["tag_validation"] == "FAIL"
        assert user.read_text() == before
