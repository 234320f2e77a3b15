"""merge-ckpt on bad inputs, mixed and rotten checkpoints, hostile targets and signals.

Every case runs the real CLI in a subprocess through the fault harness and asserts the whole failure contract: exit
code, one `Error:` line naming the problem, a `Hint:`, no traceback, nothing created, changed or deleted (the input
copy sits in the watched tree, so "the input was not modified" is part of it), no temporary file, no process left.
Each case damages a copy of a checkpoint made by the real tools (the `merge_ckpts` producers: DeepSpeed ZeRO-1/2/3
saved at steps 1 and 2 plus a second ZeRO-2 run, raw FSDP2 + DCP, Accelerate's save_state after steps 1 and 2 with
the manifest accelkit's templates write, save_pretrained shards, torch.save).
"""

from __future__ import annotations

import errno
import json
import resource
import shutil
import signal
from pathlib import Path

import pytest
import torch
from helpers.faults import run_fault

MANIFEST = "accelkit-manifest.json"
# Cases on the `merge_ckpts` checkpoints are slow (tests/conftest.py marks them: making them starts real 2-rank
# jobs), and so are the signal cases (a 384 MB merge). The rest cost one CLI run each and stay in the fast loop;
# tests/unit/merge/test_merge_synthetic.py repeats many of these cases in process, on one-process checkpoints.


@pytest.fixture
def ckpts(merge_ckpts: Path) -> Path:
    return merge_ckpts


def copy_in(ckpts: Path, rel: str, tmp_path: Path) -> Path:
    src, dst = ckpts / rel, tmp_path / "in" / Path(rel).name
    dst.parent.mkdir(exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dst)
    else:
        shutil.copy2(src, dst)
    return dst


def merge(tmp_path: Path, src: Path, *extra: str, out: Path | None = None, expect: str = "refused", **kwargs):
    out = out or tmp_path / "merged.safetensors"
    return run_fault(["merge-ckpt", str(src), "-o", str(out), "-q", *extra], watch=[tmp_path], expect=expect,
                     **kwargs)


def refused(tmp_path: Path, src: Path, *extra: str, match: str, out: Path | None = None, **kwargs) -> str:
    return merge(tmp_path, src, *extra, out=out, **kwargs).assert_refused(match)


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0x01]))  # the lowest mantissa bit: a finite value stays finite


def data_offset(archive_path: Path, start: int = 0, length: int | None = None) -> int:
    """Byte offset in the file of the middle of the largest tensor record of a torch.save archive (a file or an
    item of a .distcp file)."""
    from accelkit.merge.records import TorchArchive

    archive = TorchArchive.open(archive_path, [], start=start, length=length)
    record = max((r for r in archive.records if "/data/" in r.name), key=lambda r: r.size)
    return record.offset + record.size // 2


def partition_offset(optim_file: Path) -> int:
    """Byte offset in a DeepSpeed optimizer file of the middle of rank's fp32 partition (what the merge reads)."""
    from accelkit.merge.torch_files import open_archive

    archive = open_archive(optim_file)
    state = archive.obj["optimizer_state_dict"]
    flat = (state.get("single_partition_of_fp32_groups") or state.get("fp32_flat_groups"))[0]
    record, offset = archive.locate(flat)
    return record.offset + offset + flat.numel() * flat.element_size() // 2


# -- layout and completeness ---------------------------------------------------------------------------------------
def test_dcp_missing_shard(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    (src / "__1_0.distcp").unlink()
    refused(tmp_path, src, match="__1_0.distcp named in .metadata is missing")


def test_dcp_truncated_shard(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    data = (src / "__0_0.distcp").read_bytes()
    (src / "__0_0.distcp").write_bytes(data[: len(data) // 2])
    refused(tmp_path, src, match="is truncated")


def test_dcp_shards_from_another_world_size(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    shutil.copy(src / "__1_0.distcp", src / "__2_0.distcp")  # left over from a 3-rank save
    refused(tmp_path, src, match="different world size")


def test_dcp_shard_from_another_save_with_other_shapes(ckpts: Path, tmp_path: Path) -> None:
    """A shard of the optimizer's save dropped over the model's: .metadata no longer describes the file."""
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    (src / MANIFEST).unlink()
    shutil.copy(src / "optimizer_0" / "__1_0.distcp", src / "pytorch_model_fsdp_0" / "__1_0.distcp")
    refused(tmp_path, src, match=r"pytorch_model_fsdp_0/__1_0.distcp.*(another save|different saves|truncated)")


def test_dcp_corrupt_metadata(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    (src / ".metadata").write_bytes((src / ".metadata").read_bytes()[:100])
    refused(tmp_path, src, match="truncated or corrupt")


def test_dcp_metadata_that_would_run_code(ckpts: Path, tmp_path: Path) -> None:
    import pickle

    src = copy_in(ckpts, "fsdp/dcp", tmp_path)

    class Payload:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path),))  # must never be called

    (src / ".metadata").write_bytes(pickle.dumps(Payload()))
    refused(tmp_path, src, match=r"refers to shutil.rmtree, which is not DCP metadata")


def test_deepspeed_missing_rank(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    (src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    line = refused(tmp_path, src, match=r"the optimizer file of rank 1 is missing "
                                        r"\(zero_pp_rank_1_mp_rank_00_optim_states\.pt\): the run had 2 ranks")
    assert "different world sizes" not in line  # issue 32 item 4: a deleted file is not a mix of runs


@pytest.mark.parametrize("kind", ["optim", "model"])
def test_deepspeed_zero3_last_rank_file_deleted_is_named(ckpts: Path, tmp_path: Path, kind: str) -> None:
    """Issue 32 item 4 (neighbours): the last rank's optimizer or model-state file of a ZeRO-3 save deleted."""
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    (src / "global_step2" / f"zero_pp_rank_1_mp_rank_00_{kind}_states.pt").unlink()
    what = "optimizer" if kind == "optim" else "model-state"
    refused(tmp_path, src, match=rf"the {what} file of rank 1 is missing \(zero_pp_rank_1_mp_rank_00_{kind}_states")


def test_deepspeed_truncated_partition(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    file = src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    file.write_bytes(file.read_bytes()[:5000])
    refused(tmp_path, src, match="truncated or corrupt")


def test_deepspeed_shards_from_different_world_sizes(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    tag = src / "global_step2"
    for kind in ("optim", "model"):  # a rank-2 file left over from a 3-rank run
        name = f"zero_pp_rank_{{}}_mp_rank_00_{kind}_states.pt"
        shutil.copy(tag / name.format(1), tag / name.format(2))
    refused(tmp_path, src, match="different world sizes")


def test_deepspeed_missing_rank_in_the_middle(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    tag = src / "global_step2"
    shutil.copy(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt", tag / "zero_pp_rank_2_mp_rank_00_optim_states.pt")
    (tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    refused(tmp_path, src, match="rank 1 is missing")


def test_deepspeed_missing_model_states(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    (src / "global_step2" / "mp_rank_00_model_states.pt").unlink()
    refused(tmp_path, src, match="checkpoint file is missing: .*mp_rank_00_model_states.pt")


def test_hf_missing_and_truncated_shards(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "hf/hf", tmp_path)
    shards = sorted(src.glob("model-*.safetensors"))
    saved = shards[1].read_bytes()
    shards[1].unlink()
    refused(tmp_path, src, match="is missing")
    shards[1].write_bytes(saved[: len(saved) - 100])
    refused(tmp_path, src, match="truncated or corrupt")


def test_pickle_outside_the_allowlist_is_refused(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    src = tmp_path / "in" / "model.pt"
    torch.save({"w": torch.zeros(3), "hook": shutil.rmtree}, src)  # a callable: must never be unpickled
    refused(tmp_path, src, match="outside the safe allowlist")


def _swap_in_rank_file(path: Path, name: str, other: str) -> None:
    """Rank file `path` with `name`'s DTensor replaced by `other`'s (another global shape): a shard of another save."""
    from torch.distributed.tensor import DTensor  # noqa: F401  (torch.load rebuilds DTensors with it imported)

    state = torch.load(path, weights_only=False)  # the test's own file, written by the producer
    state[name] = state[other]
    torch.save(state, path)


PER_RANK_FAULTS = {
    # Accelerate's names carry no world size: the device mesh in rank 0's file says 2 ranks
    "accelerate-missing-rank": ("accelerate/per_rank", "unlink", "pytorch_model_fsdp_0_rank1.bin",
                                r"the file of rank 1 is missing: the device mesh has 2 ranks"),
    "mixed-world-sizes": ("fsdp/verl", "copy-as", "model_world_size_4_rank_1.pt",
                          r"files of different world sizes: 2 \(2 files\), 4 \(1 file\)"),
    "wrong-shape": ("fsdp/verl", "swap", "model_world_size_2_rank_1.pt",
                    r"model_world_size_2_rank_1\.pt: 'model\.layers\.0\.self_attn\.q_proj\.weight' is \(16, 32\)"),
    "rank-0-copied-as-rank-1": ("fsdp/verl", "copy-over", "model_world_size_2_rank_1.pt",
                                r"_rank_1\.pt holds the shard of mesh coordinate \(0,\), not rank 1's"),
}


@pytest.mark.parametrize("case", list(PER_RANK_FAULTS))
def test_per_rank_files_that_are_not_one_save(ckpts: Path, tmp_path: Path, case: str) -> None:
    """FSDP2's per-rank files (Accelerate's use_dcp=False, verl's model_world_size_N_rank_R.pt): a rank file
    missing, files of two world sizes, a shard of another shape, a shard at another rank's place: refused, nothing
    written."""
    rel, action, name, match = PER_RANK_FAULTS[case]
    src = copy_in(ckpts, rel, tmp_path)
    rank0 = sorted(src.iterdir())[0]
    if action == "unlink":
        (src / name).unlink()
    elif action == "copy-as":
        shutil.copy(src / "model_world_size_2_rank_1.pt", src / name)
    elif action == "copy-over":
        shutil.copy(rank0, src / name)
    else:
        _swap_in_rank_file(src / name, "model.layers.0.self_attn.q_proj.weight",
                           "model.layers.0.self_attn.k_proj.weight")
    refused(tmp_path, src, match=match)


# -- mixed checkpoints: rank files of another step or another run ---------------------------------------------------
def test_dcp_rank_files_from_another_step(ckpts: Path, tmp_path: Path) -> None:
    """Rank 1's files of the step-1 save copied into the step-2 folder (no manifest): Accelerate's RNG files and
    the optimizer's step counters disagree, and the odd file is named."""
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    step1 = ckpts / "accelerate" / "ckpt-step1"
    (src / MANIFEST).unlink()
    for rel in ("pytorch_model_fsdp_0/__1_0.distcp", "optimizer_0/__1_0.distcp", "random_states_1.pkl"):
        shutil.copy(step1 / rel, src / rel)
    refused(tmp_path, src, match=r"random_states_1.pkl was saved at step 1, random_states_0.pkl at step 2")


def test_dcp_optimizer_shard_from_another_step(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    (src / MANIFEST).unlink()
    shutil.copy(ckpts / "accelerate" / "ckpt-step1" / "optimizer_0" / "__1_0.distcp",
                src / "optimizer_0" / "__1_0.distcp")
    refused(tmp_path, src, match=r"optimizer_0/__1_0.distcp holds optimizer step 1, __0_0.distcp step 2")


def test_dcp_model_shard_from_another_step_is_caught_by_the_manifest(ckpts: Path, tmp_path: Path) -> None:
    """Only the model shard swapped: same shapes, same layout, valid checksums. The manifest catches it."""
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    shutil.copy(ckpts / "accelerate" / "ckpt-step1" / "pytorch_model_fsdp_0" / "__1_0.distcp",
                src / "pytorch_model_fsdp_0" / "__1_0.distcp")
    refused(tmp_path, src / "pytorch_model_fsdp_0",
            match=r"__1_0.distcp does not match its sha256 in accelkit-manifest.json")


def test_deepspeed_rank_file_from_another_step(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    name = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shutil.copy(src / "global_step1" / name, src / "global_step2" / name)
    refused(tmp_path, src, match=rf"{name} holds optimizer step 1, zero_pp_rank_0_mp_rank_00_optim_states.pt step 2")


def test_deepspeed_rank_file_from_another_run_at_the_same_step(ckpts: Path, tmp_path: Path) -> None:
    """Same shapes, same step, same counters: the fp32 partition disagrees with the weights in the model states."""
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    name = "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shutil.copy(ckpts / "ds" / "zero2_other" / "global_step2" / name, src / "global_step2" / name)
    refused(tmp_path, src, match=rf"{name} does not hold the weights of mp_rank_00_model_states.pt")


def test_deepspeed_zero3_rank_files_from_another_step(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    for kind in ("model", "optim"):
        name = f"zero_pp_rank_1_mp_rank_00_{kind}_states.pt"
        shutil.copy(src / "global_step1" / name, src / "global_step2" / name)
    refused(tmp_path, src, match=r"zero_pp_rank_1_mp_rank_00_model_states.pt was saved at step 1, .* at step 2")


def test_deepspeed_tag_folder_of_another_step(ckpts: Path, tmp_path: Path) -> None:
    """The step-1 save renamed to the folder `latest` names: its files say step 1."""
    src = copy_in(ckpts, "ds/zero1", tmp_path)
    shutil.rmtree(src / "global_step2")
    (src / "global_step1").rename(src / "global_step2")
    refused(tmp_path, src, match=r"was saved at step 1, but its folder is global_step2")



# -- step counters of different files (issue 19, item 6): the manifest, optimizer, scheduler, RNG of two saves -----
def _mix(ckpts: Path, tmp_path: Path, base: str, other: str, *rels: str) -> Path:
    """A copy of the `base` save_state folder with `rels` (files or folders) taken from the `other` save."""
    src = copy_in(ckpts, f"accelerate/{base}", tmp_path)
    for rel in rels:
        if (src / rel).is_dir():
            shutil.rmtree(src / rel)
            shutil.copytree(ckpts / "accelerate" / other / rel, src / rel)
        else:
            shutil.copy(ckpts / "accelerate" / other / rel, src / rel)
    return src


def test_manifest_and_model_of_one_step_optimizer_and_rng_of_another(ckpts: Path, tmp_path: Path) -> None:
    """The reported case: manifest and model of step 1; RNG, optimizer and scheduler of step 2. Before, exit 0."""
    src = _mix(ckpts, tmp_path, "ckpt-step1", "ckpt", "optimizer_0", "random_states_0.pkl", "random_states_1.pkl",
               "scheduler.bin")
    line = refused(tmp_path, src, match=r"optimizer_0/")
    assert MANIFEST in line or "scheduler.bin" in line, line  # the manifest, or the scheduler beside it


def test_optimizer_step_disagrees_with_the_manifest(ckpts: Path, tmp_path: Path) -> None:
    """Step-2 optimizer shards under the step-1 layout file (same sizes: the manifest's size check passes)."""
    src = _mix(ckpts, tmp_path, "ckpt-step1", "ckpt", "optimizer_0/__0_0.distcp", "optimizer_0/__1_0.distcp")
    refused(tmp_path, src, match=r"optimizer_0/__\d_0.distcp holds optimizer step 2, .*accelkit-manifest.json step 1")


def test_scheduler_of_another_step_under_a_manifest(ckpts: Path, tmp_path: Path) -> None:
    """scheduler.bin and the RNG files have the same size at every step: only the learning rate tells."""
    src = _mix(ckpts, tmp_path, "ckpt-step1", "ckpt", "scheduler.bin", "random_states_0.pkl", "random_states_1.pkl")
    refused(tmp_path, src, match=r"scheduler.bin last set the learning rate to 0.0125, but .*optimizer_0 holds 0.0075")


def test_optimizer_of_another_step_without_a_manifest(ckpts: Path, tmp_path: Path) -> None:
    src = _mix(ckpts, tmp_path, "ckpt", "ckpt-step1", "optimizer_0")
    (src / MANIFEST).unlink()
    refused(tmp_path, src, match=r"scheduler.bin last set the learning rate to 0.0125, but .*optimizer_0 holds 0.0075")


def test_one_save_lists_every_counter_it_compared(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    result = merge(tmp_path, src, expect="ok", out=tmp_path / "merged.safetensors")
    assert result.returncode == 0, result.stderr
    assert ("step counters agree across the folder: optimizer step 2 against step 2 in accelkit-manifest.json; "
            "learning rate 0.0125 in the optimizer and the scheduler") in result.stdout
    result.assert_clean(owned=[tmp_path / "merged.safetensors"])


def test_deepspeed_global_steps_disagree_with_the_manifest(ckpts: Path, tmp_path: Path) -> None:
    """A manifest (as accelkit's templates write) of step 1 over a DeepSpeed save of step 2."""
    import hashlib

    src = copy_in(ckpts, "ds/zero3", tmp_path)
    files = {p.relative_to(src).as_posix(): {"size": p.stat().st_size,
                                              "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
             for p in sorted(src.rglob("*")) if p.is_file()}
    (src / MANIFEST).write_text(json.dumps({"format": "accelkit-checkpoint-manifest", "run_id": "r", "step": 1,
                                            "world_size": 2, "files": files}))
    refused(tmp_path, src, match=r"accelkit-manifest.json holds step 1, .*zero_pp_rank_0_mp_rank_00_model_states.pt "
                                 r"global_steps 2")

# -- bit rot ------------------------------------------------------------------------------------------------------
def test_dcp_flipped_bit_in_tensor_data(ckpts: Path, tmp_path: Path) -> None:
    """Before, this passed and --verify even reported the output bit-exact (it re-read the same rotten input)."""
    from accelkit.merge.dcp import read_metadata

    src = copy_in(ckpts, "fsdp/dcp", tmp_path)
    item = max((i for i in read_metadata(src).storage_data.values() if i.relative_path == "__1_0.distcp"),
               key=lambda i: i.length)
    flip_byte(src / "__1_0.distcp", data_offset(src / "__1_0.distcp", item.offset, item.length))
    refused(tmp_path, src, "--verify", match=r"__1_0.distcp is corrupt: the CRC-32 of its record .* does not match")


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_flipped_bit_in_a_partition(ckpts: Path, tmp_path: Path, stage: int) -> None:
    src = copy_in(ckpts, f"ds/zero{stage}", tmp_path)
    file = src / "global_step2" / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    flip_byte(file, partition_offset(file))
    refused(tmp_path, src, match=r"zero_pp_rank_0_mp_rank_00_optim_states.pt is corrupt: the CRC-32")


def test_flipped_bit_in_a_torch_save_file(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "hf/torch/pytorch_model.bin", tmp_path)
    flip_byte(src, data_offset(src))
    refused(tmp_path, src, match="pytorch_model.bin is corrupt: the CRC-32")


def _with_an_inf(ckpts: Path, tmp_path: Path) -> Path:
    """A checkpoint format without checksums (safetensors) where a flipped exponent bit made an inf."""
    from safetensors.torch import load_file, save_file

    (tmp_path / "in").mkdir()
    tensors = load_file(ckpts / "hf" / "hf_expected.safetensors")
    tensors["model.norm.weight"][3] = float("inf")
    save_file(tensors, tmp_path / "in" / "model.safetensors", metadata={"format": "pt"})
    return tmp_path / "in" / "model.safetensors"


def test_non_finite_values_are_refused(ckpts: Path, tmp_path: Path) -> None:
    src = _with_an_inf(ckpts, tmp_path)
    refused(tmp_path, src, match=r"tensor 'model.norm.weight' holds 1 non-finite values")


def test_non_finite_values_are_written_when_allowed(ckpts: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    src = _with_an_inf(ckpts, tmp_path)
    out = tmp_path / "merged.safetensors"
    result = merge(tmp_path, src, "--allow-nonfinite", out=out, expect="ok")
    assert result.returncode == 0, result.stderr
    assert "non-finite values, written as they are" in result.stdout
    assert torch.isinf(load_file(out)["model.norm.weight"][3])
    result.assert_clean(owned=[out])


def test_cast_that_overflows(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    (tmp_path / "in").mkdir()
    save_file({"w": torch.full((4,), 1e6)}, tmp_path / "in" / "big.safetensors")
    refused(tmp_path, tmp_path / "in" / "big.safetensors", "--dtype", "fp16",
            match=r"tensor 'w' overflows the --dtype you asked for: 4 values become inf")


# -- manifest -------------------------------------------------------------------------------------------------------
def test_bad_manifest(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    text = (src / MANIFEST).read_text()
    (src / MANIFEST).write_text(text[: len(text) // 2])
    refused(tmp_path, src, match=r"accelkit-manifest.json is not a valid accelkit checkpoint manifest")


def test_manifest_names_a_missing_file(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    (src / "optimizer_0" / "__0_0.distcp").unlink()
    refused(tmp_path, src, match=r"optimizer_0/__0_0.distcp, listed in accelkit-manifest.json, is missing")


def test_manifest_of_another_world_size(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "accelerate/ckpt", tmp_path)
    manifest = json.loads((src / MANIFEST).read_text())
    manifest["world_size"] = 4
    (src / MANIFEST).write_text(json.dumps(manifest))
    refused(tmp_path, src, match=r"written by a 4-process run but the checkpoint holds 2 ranks")


# -- where the output goes ------------------------------------------------------------------------------------------
def test_output_inside_the_input(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero2", tmp_path)
    refused(tmp_path, src, match="is inside the input", out=src / "merged.safetensors")


def test_input_inside_the_output_even_with_force(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "hf/hf", tmp_path)
    refused(tmp_path, src, "--force", match="is inside the output", out=tmp_path / "in")


@pytest.mark.slow  # two merges that import torch; in process: tests/unit/merge/test_merge_synthetic.py
def test_unknown_layout_and_missing_input(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("not a checkpoint")
    error = refused(tmp_path, tmp_path / "in", match="not a checkpoint layout merge-ckpt knows")
    assert "notes.txt" in error
    refused(tmp_path, tmp_path / "nope", match="does not exist")


def test_force_never_deletes_files_merge_did_not_write(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    out.mkdir()
    (out / "model.safetensors").write_bytes(b"an older model")
    (out / "notes.md").write_text("my notes")
    (out / "eval").mkdir()
    (out / "eval" / "results.json").write_text("{}")
    error = refused(tmp_path, ckpts / "hf" / "hf", "--force", out=out,
                    match=r"--force replaces a folder only when it holds nothing but an earlier merge's output")
    assert "eval/" in error and "notes.md" in error and "model.safetensors" in error


def test_force_replaces_an_earlier_merge(ckpts: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    first = merge(tmp_path, ckpts / "hf" / "hf", "--max-shard-size", "20KB", out=out, expect="ok")
    assert first.returncode == 0, first.stderr
    assert len(list(out.glob("model-0000*-of-*.safetensors"))) > 1
    again = merge(tmp_path, ckpts / "ds" / "zero2", "--force", out=out, expect="ok")
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]  # the old shards are gone
    again.assert_clean(owned=[out])


def test_read_only_target_names_the_cause_and_the_path(ckpts: Path, tmp_path: Path) -> None:
    target = tmp_path / "readonly"
    target.mkdir()
    for out in (target / "merged.safetensors", target / "merged"):
        line = merge(tmp_path, ckpts / "hf" / "hf", out=out, readonly=target).assert_refused("read-only")
        assert str(out) in line and "accelkit-tmp" not in line and "disk space" not in line


def test_not_enough_space_is_refused_up_front(ckpts: Path, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    out = small / "merged.safetensors"
    line = merge(tmp_path, ckpts / "hf" / "hf", out=out, small_fs=(small, 32 * 1024)).assert_refused(
        r"not enough disk space for .*merged.safetensors: the output needs \d+\.\d\d KiB, \d+\.\d\d KiB are free in")
    assert "accelkit-tmp" not in line and "0.00 GiB" not in line


def _limit_file_size() -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # get EFBIG from write() instead of being killed
    resource.setrlimit(resource.RLIMIT_FSIZE, (30_000, 30_000))


def test_a_real_write_failure_from_the_os(ckpts: Path, tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes the kernel refuse the write (EFBIG) halfway through the 66 KB output."""
    src = copy_in(ckpts, "hf/hf", tmp_path)
    refused(tmp_path, src, match="exceeds the file-size limit", preexec_fn=_limit_file_size)


def test_full_disk_mid_write_leaves_nothing(ckpts: Path, tmp_path: Path, monkeypatch) -> None:
    """ENOSPC from the kernel in the middle of the output (in process: a real full disk cannot be timed)."""
    from accelkit.errors import AccelkitError
    from accelkit.merge import MergeOptions, writer
    from accelkit.merge.api import merge_checkpoint

    calls = []

    def no_space(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise self.error(OSError(errno.ENOSPC, "No space left on device"))
        return real(self, data)

    real = writer.SafetensorsWriter.append
    monkeypatch.setattr(writer.SafetensorsWriter, "append", no_space)
    out = tmp_path / "merged"
    with pytest.raises(AccelkitError, match="disk full"):
        merge_checkpoint(MergeOptions(input=ckpts / "ds" / "zero1", output=out, max_shard_size="20KB",
                                      progress=False))
    assert list(tmp_path.iterdir()) == []


def test_unreadable_input_is_a_read_error_not_a_write_error(ckpts: Path, tmp_path: Path) -> None:
    src = copy_in(ckpts, "ds/zero3", tmp_path)
    shard = src / "global_step2" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    shard.chmod(0)
    try:
        line = merge(tmp_path, src, unprivileged=True).assert_refused(r"cannot read .*: permission denied")
        assert str(shard) in line
    finally:
        shard.chmod(0o644)


# -- signals --------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_checkpoint(tmp_path_factory) -> Path:
    """A 384 MB safetensors file: long enough to merge that a signal lands in the middle."""
    from safetensors.torch import save_file

    path = tmp_path_factory.mktemp("big") / "big.safetensors"
    save_file({f"w{i}": torch.zeros(8 * 1024 * 1024) for i in range(12)}, path)
    yield path
    path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize("signum,code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGHUP", "SIGINT"])
def test_signal_mid_merge_leaves_nothing(big_checkpoint: Path, tmp_path: Path, signum: int, code: int) -> None:
    out = tmp_path / "merged.safetensors"
    result = run_fault(["merge-ckpt", str(big_checkpoint), "-o", str(out), "--verify"],
                       watch=[tmp_path, big_checkpoint], send_signal=("accelkit: merging", signum), kind="signal",
                       expect="signal")
    assert result.returncode == code, result.stderr[-2000:]
    assert not result.traceback and not result.error_lines
    result.assert_clean()


@pytest.mark.slow
def test_sigkill_leftovers_are_removed_by_the_next_run(big_checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged.safetensors"
    args = ["merge-ckpt", str(big_checkpoint), "-o", str(out), "--verify"]
    killed = run_fault(args, watch=[tmp_path], send_signal=("accelkit: merging", signal.SIGKILL), kind="signal",
                       expect="killed")
    assert killed.returncode == -signal.SIGKILL
    assert [Path(p).name for p in killed.leftovers] == [f".merged.safetensors.accelkit-tmp-{_pid(killed)}"]
    after = run_fault([*args, "-q"], watch=[tmp_path], expect="ok")
    assert after.returncode == 0, after.stderr[-2000:]
    assert "the partial output of an interrupted earlier merge" in after.stderr
    after.assert_clean(owned=[out, *killed.leftovers])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["merged.safetensors"]


def _pid(result) -> str:
    return result.leftovers[0].rsplit("-", 1)[1]


# -- a real Trainer FSDP checkpoint (issue 32 item 1): every claim the report makes is a Checked: line ---------------
def _trainer_checkpoint(ckpts: Path, tmp_path: Path, step: int = 4) -> Path:
    assert (ckpts / "trainer.rc").read_text() == "0", (ckpts / "trainer.log").read_text()[-4000:]
    return copy_in(ckpts, f"trainer/checkpoint-{step}", tmp_path)


def test_trainer_checkpoint_merges_with_every_counter_checked(ckpts: Path, tmp_path: Path) -> None:
    """transformers' Trainer (FSDP, sharded state dict): trainer_state.json's global_step, the scheduler's and the
    optimizer's step counters are compared; the RNG files are counted per process and said not to carry a step; the
    tied lm_head is written once; a folder without config.json is flagged as not loadable."""
    src = _trainer_checkpoint(ckpts, tmp_path)
    out = tmp_path / "merged"
    result = merge(tmp_path, src, out=out, expect="ok")
    assert result.returncode == 0, result.stderr
    result.assert_clean(owned=[out])
    report = result.stdout
    assert "checkpoint-4/ is a Trainer checkpoint folder" in report
    assert "global_step in trainer_state.json, scheduler step (last_epoch) in scheduler.pt" in report
    assert "optimizer step 4 against step 4 in trainer_state.json" in report
    assert "one RNG file per process (rng_state_0.pth, rng_state_1.pth: 2)" in report
    assert "they record no step" in report
    assert "tied weights stored once, as transformers does: lm_head.weight -> model.embed_tokens.weight" in report
    assert "Warning:     no config.json" in report and "from_pretrained cannot load it" in report
    from safetensors import safe_open

    with safe_open(out / "model.safetensors", "pt") as merged:
        names = set(merged.keys())  # noqa: SIM118 (a safetensors handle is not a dict)
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names


@pytest.mark.parametrize("side_file", ["optimizer_0", "scheduler.pt", "trainer_state.json"])
def test_trainer_side_file_from_another_step_is_refused_naming_both(ckpts: Path, tmp_path: Path,
                                                                    side_file: str) -> None:
    """Each side file of checkpoint-4 swapped for checkpoint-2's: refused, naming the swapped file and the one it
    disagrees with (before: exit 0 and no finding for optimizer_0/)."""
    src = _trainer_checkpoint(ckpts, tmp_path)
    older = ckpts / "trainer" / "checkpoint-2" / side_file
    target = src / side_file
    if target.is_dir():
        shutil.rmtree(target)
        shutil.copytree(older, target)
    else:
        shutil.copy2(older, target)
    line = refused(tmp_path, src, match=r"the files come from different saves")
    assert side_file in line
    others = {"optimizer_0": "trainer_state.json", "scheduler.pt": "trainer_state.json",
              "trainer_state.json": "scheduler.pt"}
    assert others[side_file] in line


def test_trainer_rng_file_missing_is_refused(ckpts: Path, tmp_path: Path) -> None:
    src = _trainer_checkpoint(ckpts, tmp_path)
    (src / "rng_state_1.pth").unlink()
    refused(tmp_path, src, match=r"RNG states of 1 processes \(rng_state_\*\.pth\) but the model was saved by 2")


def test_trainer_rng_file_from_another_step_is_not_claimed_checked(ckpts: Path, tmp_path: Path) -> None:
    """An RNG file records no step: a swapped one cannot be caught, and the report says its step was not checked
    rather than claiming it (the optimizer, scheduler and trainer_state.json are what is compared)."""
    src = _trainer_checkpoint(ckpts, tmp_path)
    shutil.copy2(ckpts / "trainer" / "checkpoint-2" / "rng_state_1.pth", src / "rng_state_1.pth")
    out = tmp_path / "merged.safetensors"
    result = merge(tmp_path, src, out=out, expect="ok")
    assert result.returncode == 0, result.stderr
    assert "they record no step, so their step cannot be checked" in result.stdout
