"""The one tensor model of the merge (no torch): what a reader found, each tensor with where its bytes are.

Readers validate the whole checkpoint when opened (every file present, complete, consistent, from one save), so a bad
input fails before any output exists. A tensor is a name, a shape, a dtype by torch's name and `segments`: pieces
that, back to back, are its contiguous bytes. A segment is a byte range of a zip record (read through its CRC-32), a
byte range of a file that carries no checksum (safetensors), or bytes torch materialises (what no byte range covers:
a DCP chunk that is not a block of whole rows, an item written through storage transforms, a strided tensor, a
legacy pickle). The one writer loop (stream) copies them window by window, so neither a model nor a whole tensor is
held in memory unless torch had to build it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.merge.counters import FolderCounters
from accelkit.merge.dtypes import TABLE
from accelkit.merge.records import RecordReader, ZipRecord


@dataclass(frozen=True)
class RecordRange:
    """`nbytes` bytes at `start` of a zip record's data."""

    record: ZipRecord
    start: int
    nbytes: int


@dataclass(frozen=True)
class FileRange:
    """`nbytes` bytes at `start` of a file without checksums (safetensors)."""

    path: Path
    start: int
    nbytes: int


@dataclass(frozen=True)
class Materialised:
    """`nbytes` bytes torch builds in memory; `fill(start, dest)` copies bytes [start, start + len(dest)) into dest."""

    nbytes: int
    fill: Callable[[int, memoryview], None]


Segment = RecordRange | FileRange | Materialised


@dataclass
class Tensor:
    name: str
    dtype: str  # torch's name: "float32", ...; what the output holds
    shape: tuple[int, ...]
    segments: list[Segment] = field(default_factory=list)
    itemsize: int = 0  # of `dtype`; given by the torch readers for dtypes safetensors cannot store
    cast_from: str | None = None  # --dtype: the dtype the segments hold, cast to `dtype` on the way out

    def __post_init__(self) -> None:
        self.itemsize = self.itemsize or TABLE[self.dtype].itemsize

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


@dataclass
class CheckpointSource:
    """What a reader found: filled by the format's reader (light_dcp, light_deepspeed, and with torch dcp,
    deepspeed, hf_sharded, torch_files) before anything is written."""

    format_name: str = ""
    root: Path = Path()
    world_size: int | None = None
    tensors: list[Tensor] = field(default_factory=list)
    # alias name -> name of the tensor it shares storage with (known from the checkpoint itself)
    aliases: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # how the input was recognised, anything notable skipped
    checks: list[str] = field(default_factory=list)  # what was checked to trust the input, one line each
    # the files making up the checkpoint (for `--inspect`, the manifest and the input-unchanged guarantee)
    files: list[Path] = field(default_factory=list)
    # True when the format cannot record tied weights (DCP saves both copies): ask the model's config instead
    ties_from_config: bool = False
    reader: RecordReader = field(default_factory=RecordReader)
    # step counters the checkpoint's own files carry (DeepSpeed's), cross-checked with the folder's (see counters)
    step_counters: FolderCounters = field(default_factory=FolderCounters)

    @property
    def by_name(self) -> dict[str, Tensor]:
        return {t.name: t for t in self.tensors}

    def close(self) -> None:
        self.reader.close()
