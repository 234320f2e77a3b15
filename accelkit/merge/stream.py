"""The one loop feeding the safetensors writer (no torch): every tensor's segments, window by window, checked and
written; and `--verify`'s re-read of them, and the comparison of two tensors' bytes (tied weights).

Each window of a record or file range is mapped from the page cache (no copy into this process), its record's CRC-32
advances and the non-finite scan runs over it while it is in the CPU's caches, and the same memory is written to the
output by a writer thread while this one maps and checks the next window (both release the GIL: ISA-L, NumPy and
os.write). Materialised segments are filled, and `--dtype` casts made (by the `cast` torch hands in), into a few
reused buffers.

Measured on the 2-core machine (a 435 MB item, medians of 9): two passes (read into a buffer for the checks, then
`os.copy_file_range`) took 0.24 s, this one pass 0.18-0.19 s; the kernel copy alone 0.15-0.28 s. At most
WINDOWS_IN_FLIGHT windows of READ_BYTES are mapped at a time, so the memory stays flat whatever the model's size.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.merge import records
from accelkit.merge.dtypes import TABLE
from accelkit.merge.nonfinite import COUNTED_BYTES, NonFiniteScan, refusal
from accelkit.merge.records import RecordReader
from accelkit.merge.source import FileRange, Materialised, RecordRange, Segment, Tensor
from accelkit.merge.writer import SafetensorsWriter, verify_output

READ_BYTES = 2 * 1024 * 1024  # read, checked and scanned while in the CPU's caches
WINDOWS_IN_FLIGHT = 2  # measured as fast as 3 (CLI, medians of 7: 0.62 s both), 2 MB less resident
# cast(source bytes, source dtype, output dtype, destination): torch's `.to`, handed in by the torch adapter
Cast = Callable[[memoryview, str, str, memoryview], None]


class Windows:
    """The bytes of segments, window by window: mapped (record and file ranges) or filled into reused buffers."""

    def __init__(self, reader: RecordReader, cast: Cast | None = None) -> None:
        self.reader, self.cast = reader, cast
        self._buffers: list[bytearray] = [bytearray() for _ in range(2 * (WINDOWS_IN_FLIGHT + 1))]
        self._turn = 0

    def buffer(self, nbytes: int) -> memoryview:
        """The next of the buffers in turn (never one a write in flight still reads)."""
        self._turn = (self._turn + 1) % len(self._buffers)
        if len(self._buffers[self._turn]) < nbytes:
            self._buffers[self._turn] = bytearray(max(nbytes, READ_BYTES))
        return memoryview(self._buffers[self._turn])[:nbytes]

    def read(self, segment: Segment, start: int, length: int, mapped: bool = True) -> memoryview:
        """Bytes [start, start + length) of a segment; a record's go through its CRC-32 unless not `mapped`
        (--verify's second read: peeked into a buffer)."""
        if isinstance(segment, RecordRange):
            if mapped:
                return self.reader.map(segment.record, segment.start + start, length)
            dest = self.buffer(length)
            self.reader.peek(segment.record, segment.start + start, dest)
            return dest
        if isinstance(segment, FileRange):
            if mapped:
                return self.reader.map_plain(segment.path, segment.start + start, length)
            dest = self.buffer(length)
            self.reader.read_plain(segment.path, segment.start + start, dest)
            return dest
        dest = self.buffer(length)
        segment.fill(start, dest)
        return dest

    def out(self, tensor: Tensor, data: memoryview) -> memoryview:
        """The window as it goes out: cast to the tensor's dtype when --dtype asked for it."""
        if tensor.cast_from is None:
            return data
        assert self.cast is not None, "a cast without torch's cast"
        dest = self.buffer(len(data) // TABLE[tensor.cast_from].itemsize * tensor.itemsize)
        self.cast(data, tensor.cast_from, tensor.dtype, dest)
        return dest

    def windows(self, tensor: Tensor, mapped: bool = True) -> Iterator[tuple[Segment, int, memoryview]]:
        """(segment, end of the window in the segment, the window's bytes as stored) for every window in order."""
        for segment in tensor.segments:
            for begin in range(0, segment.nbytes, READ_BYTES):
                length = min(READ_BYTES, segment.nbytes - begin)
                yield segment, begin + length, self.read(segment, begin, length, mapped)


def write_tensors(target: Path, header: bytes, tensors: list[Tensor], windows: Windows, scan: NonFiniteScan,
                  allow_nonfinite: bool, label: Path, on_bytes: Callable[[int], None]) -> None:
    """Header, then every window of every tensor, in one pass (see the module docstring). A refusal counts the
    non-finite values in the COUNTED_BYTES of the segment where they were found first."""
    pending: collections.deque = collections.deque()
    writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="accelkit-write")

    def settle(future) -> None:
        try:
            future.result()
        finally:
            future.view.release()

    out = SafetensorsWriter(target, header, sum(t.nbytes for t in tensors), label)
    try:
        for tensor in tensors:
            stored = tensor.cast_from or tensor.dtype
            bad = stored_bad = 0
            for segment, end, view in windows.windows(tensor):
                data = windows.out(tensor, view)
                counted = scan.count(data, tensor.dtype) if records.SCAN_NONFINITE else 0
                if counted:
                    scan.found(tensor.name, counted)
                    bad += counted
                    stored_bad += scan.count(view, stored) if data is not view else counted
                if data is not view:
                    view.release()
                if bad and not allow_nonfinite and (end % COUNTED_BYTES == 0 or end == segment.nbytes):
                    data.release()
                    raise refusal(tensor.name, bad, overflow=stored != tensor.dtype and TABLE[stored].floating
                                  and not stored_bad)
                if end % COUNTED_BYTES == 0 or end == segment.nbytes:
                    bad = stored_bad = 0
                future = writer.submit(_write_window, out, data)
                future.view = data
                pending.append(future)
                while len(pending) >= WINDOWS_IN_FLIGHT:
                    settle(pending.popleft())
                on_bytes(len(data))
        while pending:
            settle(pending.popleft())
        out.close()
    finally:
        for future in pending:
            future.cancel()
        writer.shutdown(wait=True)  # never close the file under a write in flight
        for future in pending:  # release() may be repeated; a view still exported elsewhere is left to the GC
            with contextlib.suppress(BufferError):
                future.view.release()
        with contextlib.suppress(AccelkitError):  # after close, nothing; after a failure, that error is the one told
            out.abort()


def _write_window(out: SafetensorsWriter, view: memoryview) -> None:
    out.append(view)


def verify_tensors(target: Path, data_start: int, tensors: list[Tensor], windows: Windows,
                   on_bytes: Callable[[int], None]) -> None:
    """`--verify`: re-read the output and compare every byte with the input read again (cast the same way)."""
    def expected():
        for tensor in tensors:
            for _, _, view in windows.windows(tensor, mapped=False):
                yield tensor.name, windows.out(tensor, view)

    verify_output(target, data_start, expected(), on_bytes, memoryview(bytearray(READ_BYTES)))


def same_values(windows: Windows, first: Tensor, second: Tensor) -> bool:
    """Whether two tensors hold the same bytes (compared window by window, read through their CRC-32)."""
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    left, right = bytearray(READ_BYTES), bytearray(READ_BYTES)
    for offset in range(0, first.nbytes, READ_BYTES):
        n = min(READ_BYTES, first.nbytes - offset)
        _read_range(windows, first.segments, offset, memoryview(left)[:n])
        _read_range(windows, second.segments, offset, memoryview(right)[:n])
        if left[:n] != right[:n]:
            return False
    return True


def _read_range(windows: Windows, segments: list[Segment], offset: int, dest: memoryview) -> None:
    """Fill `dest` with bytes [offset, offset + len(dest)) of the segments laid back to back."""
    done = 0
    for segment in segments:
        if offset >= segment.nbytes:
            offset -= segment.nbytes
            continue
        take = min(segment.nbytes - offset, len(dest) - done)
        part = dest[done:done + take]
        if isinstance(segment, RecordRange):
            windows.reader.read(segment.record, segment.start + offset, part)
        elif isinstance(segment, FileRange):
            windows.reader.read_plain(segment.path, segment.start + offset, part)
        else:
            assert isinstance(segment, Materialised)
            segment.fill(offset, part)
        done += take
        offset = 0
        if done == len(dest):
            return
