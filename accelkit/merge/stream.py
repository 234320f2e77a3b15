"""Copying tensors from a checkpoint into safetensors files, piece by piece, in two reused buffers.

Each tensor's bytes (its source segments, see source) go in pieces of at most PIECE_BYTES. This thread reads a piece
into a buffer (the record's CRC-32 advances as it is read); a helper thread scans it for non-finite values and
appends it to the output, while this thread reads the next piece into the other buffer. Two buffers take turns, so
memory stays at two pieces whatever the size of the model or of its largest tensor.

Bytes that are stored in a file exactly as they go out (no `--dtype` cast) are never copied into this process: the
piece is mapped from the page cache (`mmap`), its CRC-32 and the non-finite scan read it there, and the writer copies
it file to file in the kernel (`os.copy_file_range`), which costs a fifth of writing it from user memory. A merge of
such a checkpoint touches every byte about as often as `cp` does, plus the two checks. Cast pieces, in-memory
tensors, and file systems that cannot copy file to file go through the buffers.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.merge import records
from accelkit.merge.dtypes import name_of
from accelkit.merge.nonfinite import COUNTED_BYTES, NonFiniteScan, refusal
from accelkit.merge.source import CheckpointSource, Segment, TensorEntry, pieces
from accelkit.merge.writer import SafetensorsWriter, safetensors_header, verify_output

PIECE_BYTES = COUNTED_BYTES  # a multiple of every element size; the non-finite count of a refusal


class Buffers:
    """Two byte buffers (and two for casts) that pieces take turns in; each remembers the write it feeds."""

    def __init__(self, piece_bytes: int = PIECE_BYTES) -> None:
        self.piece_bytes = piece_bytes
        self._raw: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8) for _ in range(2)]
        self._cast: list[torch.Tensor] = [torch.empty(0, dtype=torch.uint8) for _ in range(2)]
        self.pending: list[Future | None] = [None, None]
        self._turn = 0

    def take(self) -> int:
        """The next buffer, once the write it fed has finished."""
        slot, self._turn = self._turn, 1 - self._turn
        self.wait(slot)
        return slot

    def wait(self, slot: int) -> None:
        future, self.pending[slot] = self.pending[slot], None
        if future is not None:
            future.result()

    def drain(self) -> None:
        """Wait for every write in flight; the first error wins, later ones are dropped."""
        errors = []
        for slot in (0, 1):
            try:
                self.wait(slot)
            except BaseException as exc:  # noqa: BLE001 - re-raised below
                errors.append(exc)
        if errors:
            raise errors[0]

    def raw(self, slot: int, nbytes: int) -> torch.Tensor:
        if self._raw[slot].numel() < nbytes:
            self._raw[slot] = torch.empty(max(nbytes, self.piece_bytes), dtype=torch.uint8)
        return self._raw[slot][:nbytes]

    def cast(self, slot: int, nbytes: int) -> torch.Tensor:
        if self._cast[slot].numel() < nbytes:
            self._cast[slot] = torch.empty(max(nbytes, self.piece_bytes), dtype=torch.uint8)
        return self._cast[slot][:nbytes]


def _as_tensor(data: memoryview, dtype: torch.dtype) -> torch.Tensor:
    """The values of a mapped piece, without a copy (torch warns that the mapping is read-only: it is only read)."""
    if not len(data):
        return torch.empty(0, dtype=dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=dtype)


def _as_memoryview(tensor: torch.Tensor) -> memoryview:
    return memoryview(tensor.numpy()) if tensor.numel() else memoryview(b"")


class TensorStream:
    """Copies source tensors into output files (see the module docstring)."""

    def __init__(self, source: CheckpointSource, allow_nonfinite: bool, on_bytes: Callable[[int], None],
                 piece_bytes: int = PIECE_BYTES) -> None:
        self.source = source
        self.allow_nonfinite = allow_nonfinite
        self.on_bytes = on_bytes
        self.scan = NonFiniteScan()
        self.buffers = Buffers(piece_bytes)
        self._sources = source.entry_by_name

    def _read_piece(self, slot: int, name: str, out_dtype: torch.dtype, segment: Segment, start: int,
                    length: int) -> tuple[torch.Tensor, bool]:
        """Piece [start, start + length) of a segment of tensor `name` in buffer `slot`, as `out_dtype` values
        (cast into the slot's cast buffer if needed); and whether it was cast."""
        src_dtype = self._sources[name].dtype
        raw = self.buffers.raw(slot, length)
        segment.fill(start, _as_memoryview(raw))
        values = raw.view(src_dtype)
        if out_dtype == src_dtype:
            return values, False
        cast = self.buffers.cast(slot, values.numel() * out_dtype.itemsize).view(out_dtype)
        cast.copy_(values)
        return cast, True

    def _scan(self, name: str, values: torch.Tensor, source_values: torch.Tensor, cast: bool) -> None:
        if not records.SCAN_NONFINITE:
            return
        bad = self.scan.count(_as_memoryview(values.view(torch.uint8)), name_of(values.dtype))
        if not bad:
            return
        self.scan.found(name, bad)
        if self.allow_nonfinite:
            return
        overflow = cast and source_values.is_floating_point() and not self.scan.count(
            _as_memoryview(source_values.view(torch.uint8)), name_of(source_values.dtype))
        raise refusal(name, bad, overflow)

    def _segments(self, name: str) -> list[Segment]:
        segments = self.source.segments(name)
        expected = self._sources[name].nbytes
        if sum(s.nbytes for s in segments) != expected:
            raise RuntimeError(f"reader bug: {name} has {sum(s.nbytes for s in segments)} bytes, expected {expected}")
        return segments

    def write_file(self, entries: list[TensorEntry], path: Path, metadata: dict[str, str], label: Path) -> None:
        """Write `entries` (output dtypes) to a new safetensors file at `path`."""
        writer = SafetensorsWriter(path, safetensors_header(entries, metadata), sum(e.nbytes for e in entries), label)

        def scan_and_append(name: str, values: torch.Tensor, source_values: torch.Tensor, cast: bool,
                            origin: tuple[Path, int] | None) -> None:
            self._scan(name, values, source_values, cast)
            writer.append(_as_memoryview(values.view(torch.uint8)), origin)

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelkit-write") as pool:
            try:
                for entry in entries:
                    for segment, start, length in pieces(self._segments(entry.name), self.buffers.piece_bytes):
                        slot = self.buffers.take()
                        origin = None
                        if segment.view is not None and entry.dtype == self._sources[entry.name].dtype:
                            values = source_values = _as_tensor(segment.view(start, length), entry.dtype)
                            cast = False
                        else:
                            values, cast = self._read_piece(slot, entry.name, entry.dtype, segment, start, length)
                            source_values = self.buffers.raw(slot, length).view(self._sources[entry.name].dtype)
                        if segment.origin is not None and not cast:
                            origin = (segment.origin[0], segment.origin[1] + start)
                        self.buffers.pending[slot] = pool.submit(scan_and_append, entry.name, values, source_values,
                                                                 cast, origin)
                        self.on_bytes(values.numel() * entry.dtype.itemsize)
                self.buffers.drain()
                writer.close()
            except BaseException:
                with contextlib.suppress(BaseException):  # the first error is the one being raised already
                    self.buffers.drain()  # never close the file under a write in flight
                with contextlib.suppress(AccelkitError):
                    writer.abort()
                raise

    def verify_file(self, entries: list[TensorEntry], path: Path, data_start: int) -> None:
        """Re-read `path` and compare every byte with the source read again (cast the same way)."""
        def expected():
            for entry in entries:
                for segment, start, length in pieces(self._segments(entry.name), self.buffers.piece_bytes):
                    values, _ = self._read_piece(0, entry.name, entry.dtype, segment, start, length)
                    yield entry.name, _as_memoryview(values.view(torch.uint8))

        scratch = _as_memoryview(self.buffers.raw(1, self.buffers.piece_bytes))
        verify_output(path, data_start, expected(), self.on_bytes, scratch)

    def same_values(self, a: str, b: str) -> bool:
        """Whether two source tensors hold the same bytes (compared piece by piece)."""
        first, second = self._sources[a], self._sources[b]
        if first.shape != second.shape or first.dtype != second.dtype:
            return False
        segments_a, segments_b = self.source.segments(a), self.source.segments(b)
        for offset in range(0, first.nbytes, self.buffers.piece_bytes):
            n = min(self.buffers.piece_bytes, first.nbytes - offset)
            left, right = self.buffers.raw(0, n), self.buffers.raw(1, n)
            read_range(segments_a, offset, _as_memoryview(left))
            read_range(segments_b, offset, _as_memoryview(right))
            if not torch.equal(left, right):
                return False
        return True


def read_range(segments: list[Segment], offset: int, dest: memoryview) -> None:
    """Fill `dest` with bytes [offset, offset + len(dest)) of the segments laid back to back."""
    done = 0
    for segment in segments:
        if offset >= segment.nbytes:
            offset -= segment.nbytes
            continue
        take = min(segment.nbytes - offset, len(dest) - done)
        segment.fill(offset, dest[done:done + take])
        done += take
        offset = 0
        if done == len(dest):
            return
