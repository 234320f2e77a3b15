"""A streaming safetensors writer (no torch): header first, then the tensors' bytes in order, never a whole file in
memory; the one writer loop (stream) feeds it.

The safetensors layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian unsigned
header size N, then N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]} (offsets relative to the end of the header, tensors packed back to back) plus an optional "__metadata__"
string map; the header is padded with spaces to a multiple of 8 bytes. Since every tensor's name, shape and dtype
are known before any byte is read, the header can be written first and the data appended piece by piece.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from accelkit.errors import AccelkitError
from accelkit.fsio import write_error
from accelkit.merge.dtypes import TABLE
from accelkit.merge.records import input_read_error, pread_into

if TYPE_CHECKING:
    from accelkit.merge.source import Tensor

SAFETENSORS_METADATA = {"format": "pt"}  # transformers refuses safetensors files without it


def safetensors_header(tensors: Iterable[Tensor], metadata: dict[str, str] | None = None) -> bytes:
    """The header for `tensors` in file order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": TABLE[t.dtype].code, "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


class SafetensorsWriter:
    """The one writer: `header`, then `data_bytes` of tensor data appended in order by consecutive `append` calls of
    any size; `close` checks that every byte came.

    `label` is the path the user asked for: a failed write names it (and the real cause), never the temporary name.
    """

    def __init__(self, path: Path, header: bytes, data_bytes: int, label: Path | None = None) -> None:
        self.path = path
        self.label = label or path
        self.header = header
        self.data_bytes = data_bytes
        self._written = 0
        try:
            # Never truncate an existing (empty, probed) file: ext4 then writes the whole file back on close.
            mode = "r+b" if path.exists() else "xb"
            self._file = open(path, mode, buffering=0)  # noqa: SIM115 - closed in close(); streams across calls
            self.write(memoryview(self.header))
            self._written = 0
        except OSError as exc:
            raise write_error(exc, self.label) from None

    def write(self, data: memoryview) -> int:
        done = 0
        try:
            while done < len(data):  # an unbuffered write may take only part of a large buffer
                done += self._file.write(data[done:])
        except OSError as exc:
            raise self.error(exc) from None
        self._written += done
        return done

    def append(self, data: memoryview) -> None:
        """Append `data` to the tensor data (what the writer loop calls: a seam for the tests that make writes fail)."""
        self.write(data)

    def error(self, exc: OSError) -> AccelkitError:
        return write_error(exc, self.label)

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._written != self.data_bytes:
                raise RuntimeError(f"{self.path}: {self.data_bytes - self._written} bytes of tensor data were never "
                                   "written")
        finally:
            self.abort()

    def abort(self) -> None:
        try:
            self._file.close()
        except OSError as exc:
            raise write_error(exc, self.label) from None


def verify_output(path: Path, data_start: int, expected: Iterable[tuple[str, memoryview]],
                  on_bytes: Callable[[int], None], scratch: memoryview | None = None) -> None:
    """`--verify`, for both paths: re-read the written file from `data_start` and compare it, piece by piece, with
    the bytes `expected` yields (tensor name, the bytes it should hold next: the input read again, cast the same way),
    read into `scratch` when it is large enough. Compared as 64-bit words with NumPy when they divide evenly (a
    memoryview compares item by item, 25 times slower)."""
    import numpy as np

    written = scratch if scratch is not None else memoryview(bytearray())
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise input_read_error(exc, path) from None
    try:
        offset = data_start
        for name, want in expected:
            length = len(want)
            if len(written) < length:
                written = memoryview(bytearray(length))
            got = written[:length]
            try:
                pread_into(fd, got, offset, path)
            except AccelkitError:
                raise AccelkitError(f"verification failed: {path.name} is shorter than planned",
                                    hint="report this as a bug; no output was written") from None
            kind = np.uint64 if length % 8 == 0 else np.uint8
            if not np.array_equal(np.frombuffer(want, dtype=kind), np.frombuffer(got, dtype=kind)):
                raise AccelkitError(f"verification failed: {name} in the output differs from the source",
                                    hint="report this as a bug; no output was written")
            offset += length
            on_bytes(length)
    finally:
        os.close(fd)
