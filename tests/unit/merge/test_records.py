"""Zip records of torch.save files: located through torch's own meta-device load, read with their CRC-32 checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from accelkit.errors import AccelkitError
from accelkit.merge.records import ChecksumError, RecordReader, TorchArchive


def saved(tmp_path: Path, **tensors: torch.Tensor) -> Path:
    path = tmp_path / "state.pt"
    torch.save(tensors, path)
    return path


def read_all(archive: TorchArchive, reader: RecordReader, tensor: torch.Tensor, piece: int) -> bytes:
    record, offset = archive.locate(tensor)
    out = bytearray()
    size = tensor.numel() * tensor.element_size()
    for start in range(0, size, piece):
        chunk = bytearray(min(piece, size - start))
        reader.read(record, offset + start, memoryview(chunk))
        out += chunk
    return bytes(out)


def flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x04
    path.write_bytes(bytes(data))


def test_tensor_bytes_come_from_their_record_and_the_crc_is_checked(tmp_path: Path) -> None:
    weight = torch.arange(1000, dtype=torch.float32)
    path = saved(tmp_path, weight=weight, bias=torch.ones(3))
    archive = TorchArchive.open(path, [])
    meta = archive.obj["weight"]
    assert meta.device.type == "meta"  # no tensor byte was read to learn the structure
    reader = RecordReader()
    assert read_all(archive, reader, meta, piece=1024) == weight.numpy().tobytes()
    assert reader.checksum_bytes == 4000
    reader.finish()  # nothing left to check: the record was read to its end in order


def test_a_flipped_data_byte_is_caught_when_read(tmp_path: Path) -> None:
    path = saved(tmp_path, weight=torch.arange(1000, dtype=torch.float32))
    record, offset = TorchArchive.open(path, []).locate(TorchArchive.open(path, []).obj["weight"])
    flip(path, record.offset + offset + 1234)
    archive = TorchArchive.open(path, [])  # the structure is intact: opening works
    with pytest.raises(ChecksumError, match="CRC-32 of its record .*data/0 does not match"):
        read_all(archive, RecordReader(), archive.obj["weight"], piece=512)


def test_records_read_in_part_are_checked_to_their_end(tmp_path: Path) -> None:
    flat = torch.arange(100, dtype=torch.float32)
    path = saved(tmp_path, flat=flat)
    archive = TorchArchive.open(path, [])
    record, offset = archive.locate(archive.obj["flat"])
    flip(path, record.offset + offset + 390)  # inside the last 10 values, which nobody reads
    reader = RecordReader()
    part = bytearray(40)
    reader.read(record, offset + 40, memoryview(part))  # skips the first 10 values (padding, say)
    assert bytes(part) == flat[10:20].numpy().tobytes()
    with pytest.raises(ChecksumError):
        reader.finish()


def test_peeking_does_not_count_towards_the_checksum(tmp_path: Path) -> None:
    path = saved(tmp_path, flat=torch.arange(100, dtype=torch.float32))
    archive = TorchArchive.open(path, [])
    record, offset = archive.locate(archive.obj["flat"])
    reader = RecordReader()
    one = bytearray(4)
    reader.peek(record, offset + 396, memoryview(one))
    assert torch.frombuffer(one, dtype=torch.float32).item() == 99.0
    assert reader.checksum_bytes == 0


def test_a_damaged_pickle_is_caught_when_opened(tmp_path: Path) -> None:
    path = saved(tmp_path, weight=torch.zeros(10))
    data = path.read_bytes()
    flip(path, data.index(b"weight"))  # a byte of data.pkl
    with pytest.raises(ChecksumError, match="data.pkl"):
        TorchArchive.open(path, [])


def test_truncated_files_and_pickled_code(tmp_path: Path) -> None:
    path = saved(tmp_path, weight=torch.zeros(1000))
    path.write_bytes(path.read_bytes()[:1500])
    with pytest.raises(AccelkitError, match="truncated or corrupt"):
        TorchArchive.open(path, [])
    import os

    torch.save({"w": torch.zeros(1), "run": os.system}, path)
    with pytest.raises(AccelkitError, match="outside the safe allowlist"):
        TorchArchive.open(path, [])


def test_an_item_inside_a_larger_file(tmp_path: Path) -> None:
    """DCP's .distcp files are torch.save archives back to back: each opens as a window of the file."""
    first, second = tmp_path / "a.pt", tmp_path / "b.pt"
    torch.save(torch.full((5,), 1.5), first)
    torch.save(torch.full((7,), 2.5), second)
    joined = tmp_path / "joined.distcp"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    archive = TorchArchive.open(joined, [], start=first.stat().st_size, length=second.stat().st_size)
    reader = RecordReader()
    assert read_all(archive, reader, archive.obj, piece=8) == torch.full((7,), 2.5).numpy().tobytes()


def test_an_input_that_fails_to_read_is_a_read_error_of_that_file(tmp_path: Path, monkeypatch) -> None:
    """EIO from the disk holding a shard names the shard and says read; it is never taken for an output problem."""
    import errno
    import os

    path = saved(tmp_path, weight=torch.arange(10, dtype=torch.float32))
    archive = TorchArchive.open(path, [])
    record, offset = archive.locate(archive.obj["weight"])

    def failing(fd, buffers, position):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "preadv", failing)
    with pytest.raises(AccelkitError, match=rf"cannot read {path}: input/output error \(the disk"):
        RecordReader().read(record, offset, memoryview(bytearray(8)))


def test_fast_crc32_is_zlibs() -> None:
    """The CRC-32 merge uses (ISA-L's when installed) gives zlib's values, also when continued over pieces."""
    import zlib

    from accelkit.merge.records import crc32

    data = os.urandom(3 * 1024 * 1024 + 7)
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[1000:], crc32(data[:1000])) == zlib.crc32(data)
    assert crc32(b"") == 0


def test_mapped_reads_equal_copied_reads_and_refuse_a_short_file(tmp_path) -> None:
    from accelkit.errors import AccelkitError
    from accelkit.merge.records import map_file

    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 40000)
    fd = os.open(path, os.O_RDONLY)
    try:
        for offset, length in ((0, 10), (4095, 70000), (123457, 1), (10_239_990, 10)):
            assert bytes(map_file(fd, offset, length, path)) == path.read_bytes()[offset:offset + length]
        assert bytes(map_file(fd, 5, 0, path)) == b""
        with pytest.raises(AccelkitError, match="is truncated"):
            map_file(fd, 10_239_990, 11, path)
    finally:
        os.close(fd)
