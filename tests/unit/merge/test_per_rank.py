"""FSDP2's per-rank files recognised by their names alone (no torch, empty files), and the shard arithmetic the
reader checks each rank's shard against, compared with DTensor's own (the real files: tests/integration/test_merge.py
and tests/faults/test_merge_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.errors import AccelkitError
from accelkit.merge.api import detect
from accelkit.merge.per_rank import _chunk, _coordinate, find_rank_files


def files(folder: Path, *names: str) -> Path:
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


def test_both_layouts_are_recognised_by_their_names(tmp_path: Path) -> None:
    verl = files(tmp_path / "verl", "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", "config.json")
    found = detect(verl)
    assert found.kind == "per_rank" and "model_world_size_2_rank_*.pt" in found.why
    assert find_rank_files(verl, None).world_size == 2
    acc = files(tmp_path / "acc", "pytorch_model_fsdp_0_rank0.bin", "pytorch_model_fsdp_0_rank1.bin",
                "pytorch_model_fsdp_1_rank0.bin", "pytorch_model_fsdp_1_rank1.bin")
    assert detect(acc / "pytorch_model_fsdp_0_rank1.bin").path == acc  # one rank's file: the folder of them all
    assert sorted(find_rank_files(acc, 1).files) == [0, 1]
    assert find_rank_files(acc, None).files[1].name == "pytorch_model_fsdp_0_rank1.bin"
    assert "2 models saved" in find_rank_files(acc, None).why


@pytest.mark.parametrize(("names", "index", "match"), [
    (["model_world_size_2_rank_1.pt"], None, r"the file of rank 0 is missing \(model_world_size_2_rank_0\.pt\)"),
    (["model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", "model_world_size_4_rank_0.pt"], None,
     r"different world sizes: 2 \(2 files\), 4 \(1 file\)"),
    (["model_world_size_2_rank_0.pt", "model_world_size_2_rank_2.pt"], None, "names rank 2 of a world of 2 ranks"),
    (["model_world_size_1_rank_0.pt"], 1, "--model-index applies only to Accelerate's FSDP models"),
    (["pytorch_model_fsdp_0_rank0.bin", "pytorch_model_fsdp_0_rank2.bin"], None,
     r"the file of rank 1 is missing \(pytorch_model_fsdp_0_rank1\.bin\)"),
    (["pytorch_model_fsdp_0_rank0.bin"], 3, r"no pytorch_model_fsdp_3_rank\*\.bin in "),
])
def test_names_that_cannot_be_one_save_are_refused(tmp_path: Path, names: list[str], index: int | None,
                                                   match: str) -> None:
    folder = files(tmp_path / "in", *names)
    with pytest.raises(AccelkitError, match=match):
        detect(folder, model_index=index)


@pytest.mark.parametrize("size", [0, 1, 5, 101, 128])
@pytest.mark.parametrize("parts", [1, 2, 3, 8])
def test_shards_are_where_dtensor_puts_them(size: int, parts: int) -> None:
    from torch.distributed.tensor import Shard

    for index in range(parts):
        length, offset = Shard.local_shard_size_and_offset(size, parts, index)
        start, got = _chunk(size, parts, index)
        assert got == length and (start == offset or length == 0), (size, parts, index)


def test_a_rank_has_its_coordinate_in_rank_order() -> None:
    import torch

    mesh = torch.arange(12).reshape(2, 3, 2)
    for rank in range(12):
        assert mesh[_coordinate(rank, (2, 3, 2))].item() == rank


def test_a_rank_file_is_loaded_with_the_allowlist_only(tmp_path: Path) -> None:
    """A rank file naming anything but tensors and DTensor's classes is refused, never unpickled; a world of one
    rank with plain tensors merges (the names give its size)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    from accelkit.merge import MergeOptions
    from accelkit.merge.api import merge_checkpoint

    folder = files(tmp_path / "in")
    torch.save({"w": torch.arange(6.0).reshape(2, 3)}, folder / "model_world_size_1_rank_0.pt")
    merge_checkpoint(MergeOptions(input=folder, output=tmp_path / "m.safetensors", progress=False))
    assert torch.equal(load_file(tmp_path / "m.safetensors")["w"], torch.arange(6.0).reshape(2, 3))
    torch.save({"w": torch.zeros(3), "hook": shutil.rmtree}, folder / "model_world_size_1_rank_0.pt")
    with pytest.raises(AccelkitError, match="model_world_size_1_rank_0.pt contains objects outside the safe allowlist"):
        merge_checkpoint(MergeOptions(input=folder, output=tmp_path / "n.safetensors", progress=False))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in", "m.safetensors"]
