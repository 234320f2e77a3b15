"""What every checkpoint reader offers the merger: a list of tensors (name, shape, dtype) and where their bytes are.

Readers validate the whole checkpoint when opened (every file present, complete, consistent, from one save), so a bad
input fails before any output exists. A tensor's data is described as `Segment`s: byte ranges that, concatenated,
are the tensor's contiguous bytes. The merger copies them piece by piece into buffers it reuses, so neither a model
nor a whole tensor is ever held in memory, and every byte read from a zip record goes through its CRC-32.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from accelkit.merge.counters import FolderCounters
from accelkit.merge.records import RecordReader, ZipRecord


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass(frozen=True)
class Segment:
    """`nbytes` bytes of a tensor's data; `fill(start, dest)` copies bytes [start, start + len(dest)) into dest.

    Segments stored as they are in a file name it: `origin` is (file, byte offset of the segment's first byte), so
    the writer can copy them file to file inside the kernel once they were read and checked; and `view(start, length)`
    gives those bytes mapped from the page cache (checked on the way, as `fill` does) without copying them."""

    nbytes: int
    fill: Callable[[int, memoryview], None]
    origin: tuple[Path, int] | None = None
    view: Callable[[int, int], memoryview] | None = None


def record_segment(reader: RecordReader, record: ZipRecord, offset: int, nbytes: int) -> Segment:
    """Bytes [offset, offset + nbytes) of a zip record, read (and checksummed) when needed."""
    return Segment(nbytes, lambda start, dest: reader.read(record, offset + start, dest),
                   (record.path, record.offset + offset),
                   lambda start, length: reader.map(record, offset + start, length))


def file_segment(reader: RecordReader, path: Path, offset: int, nbytes: int) -> Segment:
    """Bytes [offset, offset + nbytes) of a file without checksums (safetensors)."""
    return Segment(nbytes, lambda start, dest: reader.read_plain(path, offset + start, dest), (path, offset),
                   lambda start, length: reader.map_plain(path, offset + start, length))


def tensor_segment(tensor: torch.Tensor) -> Segment:
    """The bytes of a tensor already in memory (legacy pickles, fallbacks that must materialise a tensor)."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)

    def fill(start: int, dest: memoryview) -> None:
        torch.frombuffer(dest, dtype=torch.uint8).copy_(flat[start:start + len(dest)])

    return Segment(flat.numel(), fill)


def lazy_segment(nbytes: int, materialise: Callable[[], torch.Tensor]) -> Segment:
    """A tensor that has to be materialised as a whole (a layout the byte-range path does not cover)."""
    cache: dict[str, torch.Tensor] = {}

    def fill(start: int, dest: memoryview) -> None:
        if "t" not in cache:
            cache["t"] = materialise().detach().contiguous().reshape(-1).view(torch.uint8)
        torch.frombuffer(dest, dtype=torch.uint8).copy_(cache["t"][start:start + len(dest)])
        if start + len(dest) >= nbytes:
            cache.clear()  # the last piece: let the tensor go

    return Segment(nbytes, fill)


def pieces(segments: list[Segment], piece_bytes: int) -> Iterator[tuple[Segment, int, int]]:
    """(segment, start, length) of at most `piece_bytes` each, in order; a piece never spans two segments."""
    for segment in segments:
        start = 0
        while start < segment.nbytes:
            length = min(piece_bytes, segment.nbytes - start)
            yield segment, start, length
            start += length


@dataclass
class CheckpointSource:
    """Base class of the readers; subclasses fill the fields in `__init__` and implement `segments`."""

    format_name: str = ""
    root: Path = Path()
    world_size: int | None = None
    entries: list[TensorEntry] = field(default_factory=list)
    # alias name -> name of the tensor it shares storage with (known from the checkpoint itself)
    aliases: dict[str, str] = field(default_factory=dict)
    # lines explaining how the input was recognised and anything notable that was skipped
    notes: list[str] = field(default_factory=list)
    # what was checked to trust the input (consistency signals, checksums), one line each
    checks: list[str] = field(default_factory=list)
    # the files making up the checkpoint (for `--inspect`, the manifest and the input-unchanged guarantee)
    files: list[Path] = field(default_factory=list)
    # True when the format cannot record tied weights (DCP saves both copies): ask the model's config instead
    ties_from_config: bool = False
    # the Accelerate save_state folder around the weights, if any (its optimizer/scheduler/RNG files are checked)
    save_state_dir: Path | None = None
    reader: RecordReader = field(default_factory=RecordReader)
    # step counters the checkpoint's own files carry (DeepSpeed's), cross-checked with the folder's (see counters)
    step_counters: FolderCounters = field(default_factory=FolderCounters)

    def segments(self, name: str) -> list[Segment]:
        """The bytes of tensor `name` (its entry's dtype, C order) as consecutive segments."""
        raise NotImplementedError

    def read(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) for `names`, each materialised in memory (small tensors, tests)."""
        by_name = self.entry_by_name
        for name in names:
            entry = by_name[name]
            out = torch.empty(entry.nbytes, dtype=torch.uint8)
            view, done = memoryview(out.numpy()), 0
            for segment in self.segments(name):
                segment.fill(0, view[done:done + segment.nbytes])
                done += segment.nbytes
            yield name, out.view(entry.dtype).reshape(entry.shape)

    def finish(self) -> None:
        """Check the checksums of records that were read only in part."""
        self.reader.finish()

    def close(self) -> None:
        self.reader.close()

    @property
    def entry_by_name(self) -> dict[str, TensorEntry]:
        return {e.name: e for e in self.entries}


class ProvenSource(CheckpointSource):
    """What the torch-free proof found (light_dcp, light_deepspeed: every tensor a sequence of checked byte ranges),
    read by the torch path when the merge needs torch for something else (a cast, shards, weights the model's config
    may tie): nothing is opened or checked again."""

    def __init__(self, found, steps: FolderCounters, ties_from_config: bool) -> None:
        super().__init__(format_name=found.format_name, root=found.root, world_size=found.world_size,
                         entries=[TensorEntry(t.name, t.shape, getattr(torch, t.dtype)) for t in found.tensors],
                         aliases=dict(found.aliases), notes=list(found.notes), checks=list(found.checks),
                         files=list(found.files), ties_from_config=ties_from_config, step_counters=steps)
        self._pieces = {t.name: t.pieces for t in found.tensors}

    def segments(self, name: str) -> list[Segment]:
        return [record_segment(self.reader, p.record, p.start, p.nbytes) for p in self._pieces[name]]
