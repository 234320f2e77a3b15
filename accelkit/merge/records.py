"""The zip records inside torch.save files: where each tensor's bytes are, and the CRC-32 that proves them.

A file written by `torch.save` is a zip archive: `data.pkl` (the pickled structure) and one stored record per tensor
storage (`data/0`, `data/1`, ...), each carrying the CRC-32 of its bytes. DeepSpeed's `.pt` files and every item of a
torch DCP `.distcp` file (a concatenation of such archives) have that layout. `torch.load` never checks the CRCs: a
flipped data byte loads silently. So merge-ckpt reads the records itself:

- `TorchArchive` loads the structure with `torch.load(map_location="meta", weights_only=True)`, which reads only the
  pickle (torch then records each storage's byte offset in the file), and the record table (names, sizes, CRC-32)
  with `zipfile`. The records that are not tensor data (the pickle, version files) are checked at once;
  `locate(tensor)` gives the record and byte range holding a meta tensor's bytes.
- `RecordReader` copies byte ranges of records into caller-owned buffers with `os.preadv` and keeps a running CRC-32
  of each record as its bytes go by in order; a record is checked the moment its last byte has been read, and
  `finish()` reads what was skipped (alignment padding) to check the rest. Records a merge never reads (Adam
  moments beside DeepSpeed's fp32 partitions) are not read, and so not checked.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import re
import struct
import time
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelkit.errors import AccelkitError, clip
from accelkit.sizes import format_bytes

try:  # ISA-L's CRC-32 (the zip polynomial, carry-less multiply): several times zlib's; optional, same values
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - depends on the environment
    crc32 = zlib.crc32

if TYPE_CHECKING:
    import torch

_DATA_RECORD = re.compile(r"(^|/)data/\d+$")  # tensor storages; every other record is the pickle or a version
_CHUNK = 8 * 1024 * 1024
CHECK_CRC = True  # benchmarks/merge.py turns the checks off to measure what they cost; nothing else does
SCAN_NONFINITE = True  # the same, for the non-finite scan of both merge paths (stream, api.py)


@dataclass(frozen=True, eq=False)
class ZipRecord:
    """One stored zip record: `size` bytes at absolute `offset` in `path`, whose CRC-32 must be `crc`."""

    path: Path
    name: str
    offset: int
    size: int
    crc: int


class Unproven(Exception):
    """What the torch-free reading of a torch.save archive cannot prove (a compressed or big-endian archive, a
    pickle it does not build): torch reads it."""


class ChecksumError(AccelkitError):
    """A record's bytes do not match the CRC-32 stored beside them: the file changed after it was written."""

    def __init__(self, record: ZipRecord) -> None:
        super().__init__(
            f"{record.path} is corrupt: the CRC-32 of its record {record.name} does not match its bytes "
            "(the file changed after it was written: bit rot or a bad copy)",
            hint="re-copy this file from the machine that wrote the checkpoint, or use an earlier checkpoint")
        self.record = record


def input_read_error(exc: OSError, path: Path) -> AccelkitError:
    """One message for a failed read of an INPUT file (never confused with a failed write of the output)."""
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccelkitError(f"cannot read {path}: permission denied",
                             hint="make the checkpoint files readable by this user (e.g. chmod -R u+r)")
    if exc.errno == errno.ENOENT:
        return AccelkitError(f"checkpoint file is missing: {path}",
                             hint="copy the complete checkpoint (every rank's files) and try again")
    if exc.errno == errno.EIO:
        return AccelkitError(f"cannot read {path}: input/output error (the disk or network file system failed)",
                             hint="check the disk holding the checkpoint, or copy the checkpoint to a healthy one")
    if exc.errno == errno.EISDIR:
        return AccelkitError(f"cannot read {path}: it is a folder where a file was expected",
                             hint="point at a complete checkpoint")
    return AccelkitError(f"cannot read {path}: {exc.strerror or type(exc).__name__}",
                         hint="check that the checkpoint files are readable")


def pread_into(fd: int, dest: memoryview, offset: int, path: Path) -> None:
    """Fill `dest` with the bytes at `offset` of an open file; a short file is a truncated checkpoint."""
    done = 0
    while done < len(dest):
        try:
            n = os.preadv(fd, [dest[done:]], offset + done)
        except OSError as exc:
            raise input_read_error(exc, path) from None
        if n == 0:
            raise AccelkitError(f"{path} is truncated: it ends at byte {offset + done}, {len(dest) - done} bytes "
                                "before the data it should hold", hint="re-copy this file from the machine that "
                                "wrote the checkpoint")
        done += n


def map_file(fd: int, offset: int, length: int, path: Path) -> memoryview:
    """A read-only view of `length` bytes at `offset` of an open file, mapped with its page tables filled at once
    (MAP_POPULATE): the bytes are checked, scanned and copied where the page cache holds them, never copied into this
    process first. The mapping lives as long as the view. A file shorter than the range is refused before mapping
    (touching a mapped page past the end of a file kills the process with SIGBUS)."""
    if length == 0:
        return memoryview(b"")
    try:
        size = os.fstat(fd).st_size
    except OSError as exc:
        raise input_read_error(exc, path) from None
    if offset + length > size:
        raise AccelkitError(f"{path} is truncated: it ends at byte {size}, {offset + length - size} bytes before the "
                            "data it should hold", hint="re-copy this file from the machine that wrote the checkpoint")
    aligned = offset - offset % mmap.ALLOCATIONGRANULARITY
    try:
        mapping = mmap.mmap(fd, length + offset - aligned, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ,
                            offset=aligned)
    except OSError as exc:
        raise input_read_error(exc, path) from None
    return memoryview(mapping)[offset - aligned:]


_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux; elsewhere pages are faulted in as they are touched


class ArchiveEnds:
    """The first and last bytes of one archive, read once. A torch.save archive keeps its pickle, its small records,
    its local headers and its record table there, around the one large data record: reading them from these two
    pieces makes the table's and headers' dozen small reads per archive (DCP has one archive per tensor and rank)
    two reads; whatever lies outside them is read from the file."""

    HEAD, TAIL = 4096, 16384

    def __init__(self, fd: int, start: int, length: int, path: Path) -> None:
        self.fd, self.path = fd, path
        self._pieces: list[tuple[int, bytearray]] = []
        for begin, size in ((start, min(length, self.HEAD)), (start + max(0, length - self.TAIL),
                                                              min(length, self.TAIL))):
            piece = bytearray(size)
            pread_into(fd, memoryview(piece), begin, path)
            self._pieces.append((begin, piece))

    def read_into(self, dest: memoryview, offset: int) -> None:
        """Fill `dest` with the file's bytes at absolute `offset`."""
        end = offset + len(dest)
        for begin, piece in self._pieces:
            if begin <= offset and end <= begin + len(piece):
                dest[:] = memoryview(piece)[offset - begin:end - begin]
                return
        pread_into(self.fd, dest, offset, self.path)


class Window(io.RawIOBase):
    """A read-only file object over bytes [start, start + length) of a file (one archive inside a .distcp file),
    read through `ends` when given."""

    def __init__(self, fd: int, start: int, length: int, path: Path, ends: ArchiveEnds | None = None) -> None:
        super().__init__()
        self._fd, self._start, self._length, self._path, self._pos = fd, start, length, path, 0
        self._ends = ends

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self._length - self._pos))
        if n:
            dest = memoryview(buffer).cast("B")[:n]
            if self._ends is not None:
                self._ends.read_into(dest, self._start + self._pos)
            else:
                pread_into(self._fd, dest, self._start + self._pos, self._path)
            self._pos += n
        return n


def local_data_offset(fd: int, header_offset: int, path: Path, ends: ArchiveEnds | None = None) -> int:
    """Where a record's bytes start: after its local header, whose extra field may differ from the central one."""
    header = bytearray(zipfile.sizeFileHeader)
    if ends is not None:
        ends.read_into(memoryview(header), header_offset)
    else:
        pread_into(fd, memoryview(header), header_offset, path)
    fields = struct.unpack(zipfile.structFileHeader, header)
    if fields[0] != zipfile.stringFileHeader:
        raise zipfile.BadZipFile(f"no local header at byte {header_offset}")
    name_length, extra_length = fields[-2], fields[-1]
    return header_offset + zipfile.sizeFileHeader + name_length + extra_length


def read_torch_archive(fd: int, file: Path, start: int, length: int) -> tuple[bytes, dict[str, ZipRecord]]:
    """A `torch.save` zip archive at [start, start + length) of a file: its pickle, CRC-32 checked, and its data
    records by storage key. Compressed, big-endian or odd archives are Unproven (the torch path reads them)."""
    records: dict[str, ZipRecord] = {}
    ends = ArchiveEnds(fd, start, length, file)
    with zipfile.ZipFile(Window(fd, start, length, file, ends)) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise Unproven(f"{file.name} has a compressed record")
            offset = local_data_offset(fd, start + info.header_offset, file, ends)
            records[info.filename] = ZipRecord(file, info.filename, offset, info.file_size, info.CRC)
    pickles = [name for name in records if name.endswith("data.pkl") and name.count("/") <= 1]
    if len(pickles) != 1:
        raise Unproven(f"{file.name} has no single data.pkl")
    prefix = pickles[0][: -len("data.pkl")]
    pickled = b""
    data: dict[str, ZipRecord] = {}
    for name, record in records.items():  # the pickle and version records: checked before anything trusts them
        if name.startswith(prefix + "data/"):
            data[name[len(prefix) + len("data/"):]] = record
            continue
        raw = bytearray(record.size)
        ends.read_into(memoryview(raw), record.offset)
        if crc32(raw) != record.crc:
            raise Unproven(f"CRC-32 of {name}")
        if name == prefix + "byteorder" and bytes(raw) != b"little":
            raise Unproven(f"{file.name} is big-endian")
        if name == pickles[0]:
            pickled = bytes(raw)
    return pickled, data


class TorchArchive:
    """The structure and record table of one torch.save archive: a whole file, or `length` bytes at `start`."""

    def __init__(self, path: Path, obj: Any, records: dict[int, ZipRecord], legacy: bool = False) -> None:
        self.path = path
        self.obj = obj  # the loaded structure; tensors are on the meta device (no bytes read)
        self.legacy = legacy  # a pre-zip torch file: no records, no checksums, tensors already in memory
        self._by_offset = records

    @classmethod
    def open(cls, path: Path, safe_globals: list, start: int = 0, length: int | None = None,
             what: str | None = None) -> TorchArchive:
        label = what or str(path)
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise input_read_error(exc, path) from None
        try:
            if length is None:
                length = os.fstat(fd).st_size
            try:
                return cls._open(path, fd, start, length, safe_globals)
            except AccelkitError:
                raise
            except Exception as exc:
                if "Unsupported global" in str(exc) or "weights_only" in str(exc):
                    raise AccelkitError(f"{label} contains objects outside the safe allowlist ({_first_line(exc)})",
                                        hint="merge-ckpt loads pickles with weights_only=True and never runs pickled "
                                             "code; re-save the state dict with plain tensors") from None
                raise AccelkitError(f"cannot read {label}: it is truncated or corrupt ({_first_line(exc)})",
                                    hint="re-copy this file from the machine that wrote the checkpoint") from None
        finally:
            os.close(fd)

    @classmethod
    def _open(cls, path: Path, fd: int, start: int, length: int, safe_globals: list) -> TorchArchive:
        import torch  # here, not at the top: the torch-free merge path (see api.py) reads records too

        window = Window(fd, start, length, path)
        if not zipfile.is_zipfile(window):
            if start == 0:  # a legacy (pre-1.6) torch.save file: no zip, no checksums; load it whole
                with torch.serialization.safe_globals(safe_globals):
                    return cls(path, torch.load(path, map_location="cpu", weights_only=True), {}, legacy=True)
            raise zipfile.BadZipFile("not a zip archive")
        records: dict[int, ZipRecord] = {}
        small: list[ZipRecord] = []
        with zipfile.ZipFile(io.BufferedReader(Window(fd, start, length, path))) as archive:
            for info in archive.infolist():
                if info.compress_type != zipfile.ZIP_STORED:
                    raise zipfile.BadZipFile(f"record {info.filename} is compressed")
                offset = local_data_offset(fd, start + info.header_offset, path)
                record = ZipRecord(path, info.filename, offset, info.file_size, info.CRC)
                records[offset - start] = record
                if not _DATA_RECORD.search(info.filename):
                    small.append(record)
        for record in small:  # the pickle and version records: checked before anything trusts them
            data = bytearray(record.size)
            pread_into(fd, memoryview(data), record.offset, path)
            if crc32(data) != record.crc:
                raise ChecksumError(record)
        with torch.serialization.safe_globals(safe_globals):
            obj = torch.load(io.BufferedReader(Window(fd, start, length, path)), map_location="meta",
                             weights_only=True)
        return cls(path, obj, records)

    @property
    def records(self) -> list[ZipRecord]:
        return list(self._by_offset.values())

    def locate(self, tensor: torch.Tensor) -> tuple[ZipRecord, int]:
        """The record holding a meta tensor's storage, and the byte offset of the tensor's first element in it."""
        storage = tensor.untyped_storage()
        offset = getattr(storage, "_checkpoint_offset", None)
        record = self._by_offset.get(offset) if offset is not None else None
        if record is None or record.size != storage.nbytes():
            raise AccelkitError(f"{self.path} is corrupt: a tensor's bytes are not where its pickle says",
                                hint="re-copy this file from the machine that wrote the checkpoint")
        return record, tensor.storage_offset() * tensor.element_size()


class RecordReader:
    """Reads byte ranges of records into caller buffers and checks each record's CRC-32 on the way."""

    def __init__(self) -> None:
        self._fds: dict[Path, int] = {}
        # record -> (bytes checked so far from its start, running CRC); absent: untouched; None: verified
        self._progress: dict[ZipRecord, tuple[int, int] | None] = {}
        self.checksum_bytes = 0  # bytes that went through CRC-32 (for the report)
        self.checksum_seconds = 0.0


    def checksum_line(self) -> str:
        """The report's check line for the CRC-32s taken."""
        return (f"CRC-32 of {format_bytes(self.checksum_bytes)} of zip records read ({self.checksum_seconds:.2f} s)"
                if self.checksum_bytes else "no zip records to checksum in this format")
    def _fd(self, path: Path) -> int:
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = self._fds[path] = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise input_read_error(exc, path) from None
        return fd

    @staticmethod
    def _check_range(record: ZipRecord, start: int, length: int) -> None:
        if start < 0 or start + length > record.size:
            raise AccelkitError(f"{record.path} is corrupt: a tensor reaches past the end of its record "
                                f"{record.name}", hint="re-copy this file from the machine that wrote the checkpoint")

    def read(self, record: ZipRecord, start: int, dest: memoryview) -> None:
        """Fill `dest` with bytes [start, start + len(dest)) of `record`."""
        self._check_range(record, start, len(dest))
        pread_into(self._fd(record.path), dest, record.offset + start, record.path)
        self._track(record, start, dest)

    def map(self, record: ZipRecord, start: int, length: int) -> memoryview:
        """Bytes [start, start + length) of `record`, mapped from the page cache instead of copied (see `map_file`),
        their CRC-32 tracked as `read` does."""
        self._check_range(record, start, length)
        data = map_file(self._fd(record.path), record.offset + start, length, record.path)
        self._track(record, start, data)
        return data

    def map_plain(self, path: Path, offset: int, length: int) -> memoryview:
        """Bytes of a file that carries no checksum (safetensors), mapped."""
        return map_file(self._fd(path), offset, length, path)

    def _track(self, record: ZipRecord, start: int, data: memoryview) -> None:
        """Advance the record's running CRC-32 over bytes just read at `start`; check it once complete."""
        progress = self._progress.get(record, (0, 0))
        if progress is None or not CHECK_CRC:
            return  # already verified
        done, crc = progress
        if start > done:  # bytes skipped (padding): bring the running CRC up to `start` first
            crc = self._crc_range(self._fd(record.path), record, done, start, crc)
            done = start
        if start == done:
            began = time.perf_counter()
            crc = crc32(data, crc)
            self.checksum_seconds += time.perf_counter() - began
            self.checksum_bytes += len(data)
            done += len(data)
        self._settle(record, done, crc)

    def peek(self, record: ZipRecord, start: int, dest: memoryview) -> None:
        """Read bytes of a record without counting them towards its checksum (samples; the full read checks)."""
        self._check_range(record, start, len(dest))
        pread_into(self._fd(record.path), dest, record.offset + start, record.path)

    def read_plain(self, path: Path, offset: int, dest: memoryview) -> None:
        """Bytes of a file that carries no checksum (safetensors)."""
        pread_into(self._fd(path), dest, offset, path)

    def _crc_range(self, fd: int, record: ZipRecord, begin: int, end: int, crc: int) -> int:
        scratch = bytearray(min(_CHUNK, end - begin))
        view = memoryview(scratch)
        while begin < end:
            part = view[: min(len(view), end - begin)]
            pread_into(fd, part, record.offset + begin, record.path)
            began = time.perf_counter()
            crc = crc32(part, crc)
            self.checksum_seconds += time.perf_counter() - began
            self.checksum_bytes += len(part)
            begin += len(part)
        return crc

    def _settle(self, record: ZipRecord, done: int, crc: int) -> None:
        if done < record.size:
            self._progress[record] = (done, crc)
            return
        if crc != record.crc:
            raise ChecksumError(record)
        self._progress[record] = None

    def finish(self) -> None:
        """Check the records that were read only in part (the bytes never read are read now)."""
        for record, progress in list(self._progress.items()):
            if progress is not None:
                done, crc = progress
                self._settle(record, record.size, self._crc_range(self._fd(record.path), record, done, record.size,
                                                                  crc))

    def close(self) -> None:
        for fd in self._fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds.clear()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return clip(text.splitlines()[0] if text else type(exc).__name__, 200)
