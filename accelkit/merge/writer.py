"""A streaming safetensors writer: header first, then the tensors' bytes in order, never a whole file in memory.

The safetensors layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian unsigned
header size N, then N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]} (offsets relative to the end of the header, tensors packed back to back) plus an optional "__metadata__"
string map; the header is padded with spaces to a multiple of 8 bytes. Since every tensor's name, shape and dtype
are known before any byte is read, the header can be written first and the data appended piece by piece.
"""

from __future__ import annotations

from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.fsio import write_error
from accelkit.merge.dtypes import TABLE
from accelkit.merge.header import safetensors_header
from accelkit.merge.source import TensorEntry

SAFETENSORS_DTYPES = {getattr(torch, name): info.code for name, info in TABLE.items()}


def build_header(entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> bytes:
    return safetensors_header(((e.name, SAFETENSORS_DTYPES[e.dtype], e.shape, e.nbytes) for e in entries), metadata)


class SafetensorsWriter:
    """Write the data of `entries` to `path` in order, as consecutive `write` calls of any size.

    `label` is the path the user asked for: a failed write names it (and the real cause), never the temporary name.
    """

    def __init__(self, path: Path, entries: list[TensorEntry], metadata: dict[str, str] | None = None,
                 label: Path | None = None) -> None:
        self.path = path
        self.label = label or path
        self.header = build_header(entries, metadata)
        self.data_bytes = sum(e.nbytes for e in entries)
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

    def fileno(self) -> int:
        """For bytes appended by someone else (a file-to-file copy): call `count` with how many."""
        return self._file.fileno()

    def count(self, nbytes: int) -> None:
        self._written += nbytes

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
