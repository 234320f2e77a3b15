"""DCP metadata checked against its shards, the non-finite scan, what --force may replace, save_state counters."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from accelkit.errors import AccelkitError


@pytest.fixture
def dcp_dir(tmp_path: Path) -> Path:
    """A real DCP save (one process, torch.distributed.checkpoint's own writer)."""
    import warnings

    import torch.distributed.checkpoint as dcp

    state = {"model.weight": torch.arange(12, dtype=torch.float32).reshape(3, 4), "model.bias": torch.ones(3)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=str(tmp_path / "ckpt"), no_dist=True)
    return tmp_path / "ckpt"


def test_a_dcp_save_reads_back_through_its_records(dcp_dir: Path) -> None:
    from accelkit.merge.dcp import open_dcp
    from accelkit.merge.records import RecordReader

    source = open_dcp(dcp_dir, RecordReader())
    tensors = {}
    for tensor in source.tensors:
        (segment,) = tensor.segments  # one row block: a byte range of its record
        data = bytearray(segment.nbytes)
        source.reader.read(segment.record, segment.start, memoryview(data))
        tensors[tensor.name] = torch.frombuffer(data, dtype=torch.float32).reshape(tensor.shape)
    assert torch.equal(tensors["model.weight"], torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert source.reader.checksum_bytes == 12 * 4 + 3 * 4
    assert "tile 1 files exactly" in source.checks[0]


def test_a_shard_longer_than_its_metadata_says(dcp_dir: Path) -> None:
    from accelkit.merge.dcp import open_dcp
    from accelkit.merge.records import RecordReader

    shard = next(dcp_dir.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes() + b"\0" * 16)
    with pytest.raises(AccelkitError, match="has 16 bytes more than .metadata describes"):
        open_dcp(dcp_dir, RecordReader())


def test_metadata_never_runs_pickled_code(dcp_dir: Path) -> None:
    from accelkit.merge.dcp import read_metadata

    (dcp_dir / ".metadata").write_bytes(pickle.dumps(print))
    with pytest.raises(AccelkitError, match="refers to builtins.print, which is not DCP metadata"):
        read_metadata(dcp_dir)


def test_nonfinite_count_is_exact_and_large_finite_values_are_not_flagged() -> None:
    from accelkit.merge.nonfinite import NonFiniteScan

    scan = NonFiniteScan()

    def count(values: torch.Tensor) -> int:
        return scan.count(memoryview(values.view(torch.uint8).numpy()), str(values.dtype).removeprefix("torch."))

    big = torch.full((10,), 3e38)  # finite, but their float32 sum overflows
    assert count(big) == 0
    values = torch.zeros(100)
    values[[3, 50]] = torch.tensor([float("nan"), float("-inf")])
    assert count(values) == 2
    assert count(values.to(torch.bfloat16)) == 2
    assert count(values.to(torch.float16)) == 2
    assert count(values.to(torch.float64)) == 2
    assert count(values.to(torch.float8_e5m2)) == 2
    assert count(values.to(torch.float8_e4m3fn)) == 1  # no inf in this format: torch saturates -inf to -448
    assert count(torch.full((10,), 448.0).to(torch.float8_e4m3fn)) == 0  # its largest finite value
    assert count(torch.full((10,), 57344.0).to(torch.float8_e5m2)) == 0


def test_force_only_replaces_what_a_merge_wrote(tmp_path: Path) -> None:
    from accelkit.merge.output import FILES_KEY, check_paths, foreign_files

    out = tmp_path / "merged"
    out.mkdir()
    index = {"metadata": {"total_size": 8, FILES_KEY: ["model-00001-of-00002.safetensors",
                                                       "model-00002-of-00002.safetensors",
                                                       "model.safetensors.index.json", "config.json"]},
             "weight_map": {}}
    (out / "model.safetensors.index.json").write_text(json.dumps(index))
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json"):
        (out / name).write_bytes(b"x")
    assert foreign_files(out) == []
    check_paths(tmp_path / "input.safetensors", out, force=True)
    (out / "README.md").write_text("mine")
    (out / "runs" / "a").mkdir(parents=True)
    (out / "runs" / "a" / "events").write_text("x")
    assert foreign_files(out) == ["README.md", "runs/"]
    with pytest.raises(AccelkitError, match="also holds: README.md, runs/"):
        check_paths(tmp_path / "input.safetensors", out, force=True)
    with pytest.raises(AccelkitError, match="already exists"):
        check_paths(tmp_path / "input.safetensors", out, force=False)


def test_shard_sizes_mean_what_they_mean_in_every_command() -> None:
    """--max-shard-size: GB is 10^9 and GiB 2^30 (accelkit.sizes, as in plan and bench); a bare number is bytes,
    as transformers' max_shard_size takes it."""
    from accelkit.merge.output import parse_shard_size

    assert parse_shard_size("5GB") == 5 * 10**9 and parse_shard_size("500MiB") == 500 * 2**20
    assert parse_shard_size("4096") == 4096
    with pytest.raises(AccelkitError, match="--max-shard-size '5G' is not a size"):
        parse_shard_size("5G")


def _rng_file(path: Path, step: int) -> None:
    torch.save({"step": step, "random_state": (3, tuple(range(5)), None), "torch_manual_seed": torch.zeros(4)}, path)


def test_save_state_rng_files_must_agree(tmp_path: Path) -> None:
    from accelkit.merge.records import RecordReader
    from accelkit.merge.savestate import check_save_state

    for rank, step in enumerate((8, 8, 6)):
        _rng_file(tmp_path / f"random_states_{rank}.pkl", step)
    with pytest.raises(AccelkitError, match=r"random_states_2.pkl was saved at step 6, random_states_0.pkl at step 8"):
        check_save_state(tmp_path, 3, RecordReader())
    _rng_file(tmp_path / "random_states_2.pkl", 8)
    assert check_save_state(tmp_path, 3, RecordReader()) == [
        "Accelerate save_state: the RNG files of all 3 processes were saved at step 8"]
    with pytest.raises(AccelkitError, match="RNG states of 3 processes .* saved by 2"):
        check_save_state(tmp_path, 2, RecordReader())


def test_verify_output_names_the_tensor_that_differs_and_a_short_file(tmp_path: Path) -> None:
    """The one --verify of both paths: compares by 64-bit words and by bytes, names the first tensor that differs."""
    from accelkit.merge.writer import verify_output

    out = tmp_path / "out.bin"
    out.write_bytes(b"H" * 8 + bytes(range(16)) + b"abc")
    seen: list[int] = []
    verify_output(out, 8, [("a", memoryview(bytes(range(16)))), ("b", memoryview(b"abc"))], seen.append)
    assert seen == [16, 3]
    with pytest.raises(AccelkitError, match=r"verification failed: b in the output differs from the source"):
        verify_output(out, 8, [("a", memoryview(bytes(range(16)))), ("b", memoryview(b"abd"))], seen.append)
    flipped = bytearray(range(16))
    flipped[9] ^= 1
    with pytest.raises(AccelkitError, match=r"verification failed: a in the output differs"):
        verify_output(out, 8, [("a", memoryview(bytes(flipped)))], seen.append, memoryview(bytearray(64)))
    with pytest.raises(AccelkitError, match=r"verification failed: out.bin is shorter than planned"):
        verify_output(out, 8, [("a", memoryview(bytes(range(16)))), ("b", memoryview(b"abcd"))], seen.append)
