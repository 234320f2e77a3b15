"""merge-ckpt end to end, in process, on small checkpoints the real tools write in a fraction of a second.

torch.distributed.checkpoint (a one-process DCP save, flat and nested as Accelerate saves it), huggingface_hub's
sharded safetensors writer, safetensors and torch.save make the inputs; `merge_checkpoint` merges them as the CLI
does. Each refusal is checked for its message, for an input left as it was, and for an output folder left empty.
The multi-rank checkpoints (FSDP2 on 2 ranks, DeepSpeed ZeRO-1/2/3, Accelerate's save_state under rehearsal) need
real ranks: their cases are in tests/faults/test_merge_faults.py and tests/integration/test_merge.py (slow).
"""

from __future__ import annotations

import errno
import hashlib
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from accelkit.errors import AccelkitError
from accelkit.merge import MergeOptions
from accelkit.merge.api import inspect_checkpoint, merge_checkpoint


def tiny_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Odd sizes (a 37-wide layer) and an integer buffer, like the producers' tiny Llama."""
    gen = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(101, 16, generator=gen),
        "layers.0.weight": torch.randn(37, 16, generator=gen),
        "layers.0.bias": torch.randn(37, generator=gen),
        "layers.1.weight": torch.randn(16, 37, generator=gen),
        "norm.weight": torch.ones(16),
        "steps": torch.tensor([7, 8, 9], dtype=torch.int64),
    }


def dcp_save(state: dict, folder: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "no process group": a one-process save is what we want
        dcp.save(state, checkpoint_id=str(folder), no_dist=True)
    return folder


@pytest.fixture
def state() -> dict[str, torch.Tensor]:
    return tiny_state()


@pytest.fixture
def inputs(tmp_path: Path, state) -> Path:
    """One folder per format, written by the real tools."""
    from huggingface_hub import save_torch_state_dict

    root = tmp_path / "in"
    dcp_save(state, root / "dcp")
    dcp_save({"model": state}, root / "nested")  # Accelerate and torchtitan save {"model": ...}
    (root / "hf").mkdir()
    save_torch_state_dict(state, str(root / "hf"), max_shard_size="4KB")
    save_file(state, str(root / "one.safetensors"))
    torch.save({"state_dict": state}, root / "model.bin")
    return root


def tree(path: Path) -> dict[str, str]:
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def merge(src: Path, out: Path, **options) -> object:
    return merge_checkpoint(MergeOptions(input=src, output=out, progress=False, **options))


def refused(src: Path, out: Path, match: str, **options) -> str:
    """The merge fails with one AccelkitError, the input is unchanged and nothing is left beside the output."""
    before, around = tree(src), sorted(out.parent.iterdir()) if out.parent.exists() else []
    with pytest.raises(AccelkitError, match=match) as error:
        merge(src, out, **options)
    assert tree(src) == before, "the input was modified"
    assert (sorted(out.parent.iterdir()) if out.parent.exists() else []) == around, "the merge left something"
    return str(error.value)


def assert_same(out: Path, state: dict[str, torch.Tensor]) -> None:
    merged = load_file(out)
    assert set(merged) == set(state)
    for name, tensor in state.items():
        assert torch.equal(merged[name], tensor), name


@pytest.mark.parametrize("fmt,expected", [
    ("dcp", "torch DCP"), ("nested", "torch DCP"), ("hf", "safetensors"), ("one.safetensors", "safetensors"),
    ("model.bin", "torch"),
], ids=["dcp", "dcp-nested", "hf-shards", "safetensors", "torch-save"])
def test_every_format_merges_to_the_same_tensors(inputs: Path, tmp_path: Path, state, fmt: str, expected: str) -> None:
    src = inputs / fmt
    if fmt == "hf":
        assert len(list(src.glob("model-*.safetensors"))) > 1, "the HF writer made one shard: use smaller shards"
    before = tree(src)
    out = tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    report = merge(src, out, verify=True)
    assert expected.lower() in report.format_name.lower(), report.format_name
    assert report.tensors == len(state) and report.verified
    assert report.parameters == sum(t.numel() for t in state.values())
    assert_same(out, state)
    with safe_open(str(out), framework="pt") as f:
        assert f.metadata()["format"] == "pt"  # what transformers' from_pretrained expects
    assert tree(src) == before and sorted(p.name for p in out.parent.iterdir()) == ["merged.safetensors"]


def test_dcp_checks_are_reported(inputs: Path, tmp_path: Path) -> None:
    report = inspect_checkpoint(inputs / "dcp")
    assert report.output is None and report.tensors == 6
    assert any("CRC-checked" in check for check in report.checks), report.checks
    assert not (tmp_path / "out").exists()


def test_folder_output_in_shards_with_an_index(inputs: Path, tmp_path: Path, state) -> None:
    out = tmp_path / "merged"
    report = merge(inputs / "dcp", out, max_shard_size="4KB")
    shards = sorted(out.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and sorted(report.output_files) == sorted([p.name for p in shards] +
                                                                       ["model.safetensors.index.json"])
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(state)
    merged = {}
    for shard in shards:
        merged.update(load_file(shard))
    assert all(torch.equal(merged[name], tensor) for name, tensor in state.items())


def test_dtype_casts_floats_and_keeps_integer_buffers(inputs: Path, tmp_path: Path, state) -> None:
    out = tmp_path / "merged.safetensors"
    merge(inputs / "hf", out, dtype="bf16")
    merged = load_file(out)
    assert merged["steps"].dtype == torch.int64 and torch.equal(merged["steps"], state["steps"])
    assert merged["embed.weight"].dtype == torch.bfloat16
    assert torch.equal(merged["embed.weight"], state["embed.weight"].to(torch.bfloat16))


# -- damaged inputs -------------------------------------------------------------------------------------------------
def test_dcp_missing_truncated_and_stray_shards(inputs: Path, tmp_path: Path) -> None:
    src, out = inputs / "dcp", tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    shard = src / "__0_0.distcp"
    data = shard.read_bytes()
    shutil.copy(shard, src / "__1_0.distcp")  # left over from a 2-rank save into the same folder
    refused(src, out, match=r"holds shards not named in its .metadata \(__1_0.distcp\)")
    (src / "__1_0.distcp").unlink()
    shard.write_bytes(data[: len(data) // 2])
    refused(src, out, match=r"shard .*/__0_0.distcp is truncated")
    shard.unlink()
    refused(src, out, match=r"shard .*__0_0.distcp named in .metadata is missing")


def test_dcp_flipped_bit_is_caught_by_the_crc(inputs: Path, tmp_path: Path) -> None:
    from accelkit.merge.dcp import read_metadata
    from accelkit.merge.records import TorchArchive

    src = inputs / "dcp"
    shard = src / "__0_0.distcp"
    item = max(read_metadata(src).storage_data.values(), key=lambda i: i.length)
    archive = TorchArchive.open(shard, [], start=item.offset, length=item.length)
    record = max((r for r in archive.records if "/data/" in r.name), key=lambda r: r.size)
    data = bytearray(shard.read_bytes())
    data[record.offset + record.size // 2] ^= 0x01  # the lowest mantissa bit: the value stays finite
    shard.write_bytes(bytes(data))
    out = tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    refused(src, out, verify=True, match=r"__0_0.distcp is corrupt: the CRC-32 of its record .* does not match")


def test_dcp_metadata_that_is_corrupt_or_would_run_code(inputs: Path, tmp_path: Path) -> None:
    import pickle

    src, out = inputs / "dcp", tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    metadata = src / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:100])
    refused(src, out, match="truncated or corrupt")

    class Payload:
        def __reduce__(self):
            return (shutil.rmtree, (str(tmp_path),))  # must never be called

    metadata.write_bytes(pickle.dumps(Payload()))
    refused(src, out, match=r"refers to shutil.rmtree, which is not DCP metadata")


def test_hf_missing_and_truncated_shards(inputs: Path, tmp_path: Path) -> None:
    src, out = inputs / "hf", tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    shard = sorted(src.glob("model-*.safetensors"))[1]
    saved = shard.read_bytes()
    shard.write_bytes(saved[: len(saved) - 100])
    refused(src, out, match="truncated or corrupt")
    shard.unlink()
    refused(src, out, match="is missing")


def test_a_pickle_outside_the_allowlist_is_never_run(tmp_path: Path) -> None:
    src = tmp_path / "in" / "model.pt"
    src.parent.mkdir()
    torch.save({"w": torch.zeros(3), "hook": shutil.rmtree}, src)
    refused(src, tmp_path / "out" / "merged.safetensors", match="outside the safe allowlist")


def test_non_finite_values_are_refused_unless_allowed(tmp_path: Path, state) -> None:
    state["norm.weight"][3] = float("inf")
    src = tmp_path / "in" / "model.safetensors"
    src.parent.mkdir()
    save_file(state, str(src))
    out = tmp_path / "out" / "merged.safetensors"
    out.parent.mkdir()
    refused(src, out, match=r"tensor 'norm.weight' holds 1 non-finite values")
    report = merge(src, out, allow_nonfinite=True)
    assert report.nonfinite == {"norm.weight": 1}
    assert torch.isinf(load_file(out)["norm.weight"][3])


def test_a_cast_that_overflows_is_refused(tmp_path: Path) -> None:
    src = tmp_path / "in" / "big.safetensors"
    src.parent.mkdir()
    save_file({"w": torch.full((4,), 1e6)}, str(src))
    refused(src, tmp_path / "out" / "m.safetensors", dtype="fp16",
            match=r"tensor 'w' overflows the --dtype you asked for: 4 values become inf")


def test_unknown_layout_and_missing_input(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "notes.txt").write_text("not a checkpoint")
    message = refused(tmp_path / "in", tmp_path / "out" / "m.safetensors", match="not a checkpoint layout")
    assert "notes.txt" in message
    with pytest.raises(AccelkitError, match="does not exist"):
        merge(tmp_path / "nope", tmp_path / "out" / "m.safetensors")


# -- where the output goes ------------------------------------------------------------------------------------------
def test_output_and_input_never_nest(inputs: Path) -> None:
    src = inputs / "dcp"
    refused(src, src / "merged.safetensors", match="is inside the input")
    with pytest.raises(AccelkitError, match="is inside the output"):
        merge(src, inputs, force=True)


def test_an_existing_output_needs_force_and_force_replaces_only_a_merge(inputs: Path, tmp_path: Path) -> None:
    out = tmp_path / "merged"
    merge(inputs / "dcp", out, max_shard_size="4KB")
    with pytest.raises(AccelkitError, match="already exists"):
        merge(inputs / "hf", out)
    merge(inputs / "one.safetensors", out, force=True)  # an earlier merge's shards are replaced, all of them
    assert sorted(p.name for p in out.iterdir()) == ["model.safetensors"]
    (out / "notes.md").write_text("mine")
    with pytest.raises(AccelkitError, match="holds nothing but an earlier merge's output.*notes.md"):
        merge(inputs / "hf", out, force=True)
    assert (out / "notes.md").read_text() == "mine"


def test_a_full_disk_mid_write_leaves_nothing(inputs: Path, tmp_path: Path, monkeypatch) -> None:
    """ENOSPC from the kernel in the middle of the output (a real full disk cannot be timed)."""
    from accelkit.merge import writer

    calls = []
    real = writer.SafetensorsWriter.append

    def no_space(self, data):
        calls.append(len(data))
        if len(calls) == 3:
            raise self.error(OSError(errno.ENOSPC, "No space left on device"))
        return real(self, data)

    monkeypatch.setattr(writer.SafetensorsWriter, "append", no_space)
    out = tmp_path / "out" / "merged"
    out.parent.mkdir()
    refused(inputs / "hf", out, max_shard_size="4KB", match="disk full")
