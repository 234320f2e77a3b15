"""The torch DCP reader: a folder's `.metadata` checked against its `.distcp` files, and its tensors as segments.

torch.distributed.checkpoint (DCP) directories, `.metadata` + `__{rank}_{i}.distcp` files: FSDP1/FSDP2 sharded
state dicts, Accelerate's `pytorch_model_fsdp_0/`, torchtitan-style `{"model": ...}` saves.
`.metadata` (read with an allowlist unpickler: no pickled code runs) gives every tensor's global shape and dtype and,
per chunk, the file, byte offset and length of the item holding it. Every item is itself a `torch.save` archive
(see records). When the checkpoint is opened, everything the metadata claims is checked against the files (below);
then a tensor's bytes are read straight from the item records, with their CRC-32 checked.

FSDP shards tensors by rows, so a tensor's bytes are its chunks' bytes back to back and are streamed in pieces.
Other layouts (chunks split along another dimension, strided local tensors) are assembled in memory from the same
checked records; items written through DCP storage transforms (compression, ...) are read with DCP's own `dcp.load`.

What the checks of `.metadata` against the `.distcp` files make, before anything is merged:

- `.metadata` is a pickle; it is read with light_pickle's unpickler (the torch-free path's too), which only builds
  DCP's own metadata classes, torch sizes, dtypes and paths, so a crafted file cannot run code.
- Storage entries: every file named exists, its items tile it exactly (each starts where the previous one ended, the
  last ends at the file's last byte) and no `.distcp` file is left over. A shard from a save with other shapes, a
  truncated or padded file, or metadata from another save fails here.
- Items: each chunk's item is a `torch.save` archive holding one tensor of the chunk's shape and dtype, whose
  pickle and record table carry valid CRC-32s. Its data record is what the merge then reads.

What this cannot tell apart: a shard from another save with exactly the same shapes (another step of the same run,
or another run of the same model). Those are caught by the Accelerate files beside the model (savestate) or a
manifest (manifest); docs/guides/checkpoint-integrity.md says so per format.
"""

from __future__ import annotations

import math
import pickle
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from accelkit.errors import AccelkitError, clip
from accelkit.merge.dtypes import name_of
from accelkit.merge.light_dcp import (
    METADATA_FILE,
    ONE_SAVE,
    RECOPY,
    check_coverage,
    check_storage_files,
    output_names,
)
from accelkit.merge.light_pickle import MetadataUnpickler
from accelkit.merge.records import TorchArchive, ZipRecord, input_read_error
from accelkit.merge.source import CheckpointSource, RecordRange, Segment
from accelkit.merge.torch_files import materialised, torch_tensor


def _torch_dtype(name: str) -> torch.dtype | None:
    dtype = getattr(torch, name, None)
    return dtype if isinstance(dtype, torch.dtype) else None


def is_tensor_item(item: object) -> bool:
    return type(item).__name__ == "TensorStorageMetadata"


def read_metadata(path: Path, real: bool = False):
    file = path / METADATA_FILE
    try:
        with open(file, "rb") as handle:
            metadata = MetadataUnpickler(handle, dtype=_torch_dtype, real=real).load()
    except OSError as exc:
        raise input_read_error(exc, file) from None
    except pickle.UnpicklingError as exc:
        if "is not part of DCP metadata" in str(exc):
            raise AccelkitError(f"{file} refers to {str(exc).split(' is not')[0]}, which is not DCP metadata",
                                hint="merge-ckpt never runs pickled code; this file was not written by "
                                     "torch.distributed.checkpoint") from None
        raise AccelkitError(f"cannot read {file}: it is truncated or corrupt ({exc})", hint=RECOPY) from None
    except Exception as exc:
        raise AccelkitError(f"cannot read {file}: it is truncated or corrupt ({type(exc).__name__})",
                            hint=RECOPY) from None
    if not all(hasattr(metadata, a) for a in ("state_dict_metadata", "storage_data")):
        raise AccelkitError(f"{file} is not DCP metadata", hint=RECOPY)
    return metadata


@dataclass(frozen=True)
class Chunk:
    """One chunk of a tensor, where its bytes are, and what its item holds."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    dtype: torch.dtype
    record: ZipRecord | None = None  # None for items written through storage transforms
    data_offset: int = 0  # byte offset of the chunk's first element in the record
    strides: tuple[int, ...] = ()
    storage_span_bytes: int = 0  # bytes from the first element to one past the last, as stored
    is_row_block: bool = False  # a contiguous block of whole rows: its bytes are a slice of the tensor's bytes
    transformed: bool = False

    @property
    def nbytes(self) -> int:
        return math.prod(self.sizes) * self.dtype.itemsize


@dataclass
class DcpLayout:
    files: list[Path] = field(default_factory=list)
    world_size: int | None = None
    chunks: dict[str, list[Chunk]] = field(default_factory=dict)
    checks: list[str] = field(default_factory=list)


def check_dcp_layout(path: Path, metadata, fqns: set[str]) -> DcpLayout:
    """Check `.metadata` against the folder's files and open the item of every chunk of the tensors `fqns`."""
    layout = DcpLayout()
    by_file, layout.world_size = check_storage_files(path, metadata)
    layout.files = [path / rel for rel in sorted(by_file)]
    # Non-tensor items (an optimizer's step, param_groups) have no offset: only tensor chunks are looked up by it.
    storage = {(index.fqn, tuple(offset)): info for index, info in metadata.storage_data.items()
               if (offset := getattr(index, "offset", None)) is not None}
    items = 0
    for fqn in sorted(fqns):
        item = metadata.state_dict_metadata[fqn]
        layout.chunks[fqn] = [_open_chunk(path, fqn, item, chunk, storage) for chunk in item.chunks]
        check_coverage(path, fqn, tuple(item.size),
                       [(c.offsets, c.sizes, c.is_row_block) for c in layout.chunks[fqn]])
        items += len(item.chunks)
    layout.checks.append(f"{METADATA_FILE} matches the shards: {len(metadata.storage_data)} items tile "
                         f"{len(by_file)} files exactly; {items} tensor items hold the shapes and dtypes it names "
                         "(pickles and record tables CRC-checked)")
    return layout


def _open_chunk(path: Path, fqn: str, item, chunk, storage: dict) -> Chunk:
    offsets, sizes, dtype = tuple(chunk.offsets), tuple(chunk.sizes), item.properties.dtype
    info = storage.get((fqn, offsets))
    if info is None:
        raise AccelkitError(f"{path / METADATA_FILE} lists a chunk of {fqn} at {list(offsets)} but no storage for it",
                            hint=RECOPY)
    if getattr(info, "transform_descriptors", None):
        return Chunk(offsets, sizes, dtype, transformed=True)
    file = path / info.relative_path
    what = f"the item of {fqn} in {file}"
    archive = TorchArchive.open(file, [], start=info.offset, length=info.length, what=what)
    tensor = archive.obj
    if archive.legacy or not isinstance(tensor, torch.Tensor):
        raise AccelkitError(f"{what} is not a tensor: {file} and {METADATA_FILE} come from different saves",
                            hint=ONE_SAVE)
    if tensor.dtype != dtype or tuple(tensor.shape) != sizes:
        raise AccelkitError(f"{what} is a {name_of(tensor.dtype)} tensor of shape {list(tensor.shape)} but "
                            f"{METADATA_FILE} says {name_of(dtype)} {list(sizes)}: the shard and {METADATA_FILE} "
                            "come from different saves", hint=ONE_SAVE)
    record, data_offset = archive.locate(tensor)
    span = _span_elements(tensor) * tensor.element_size()
    if data_offset + span > record.size:
        raise AccelkitError(f"{what} is corrupt: its tensor reaches past its record", hint=RECOPY)
    full_rows = all(o == 0 for o in offsets[1:]) and sizes[1:] == tuple(item.size)[1:]
    return Chunk(offsets, sizes, dtype, record, data_offset, tuple(tensor.stride()), span,
                 is_row_block=full_rows and tensor.is_contiguous())


def _span_elements(tensor: torch.Tensor) -> int:
    if tensor.numel() == 0:
        return 0
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True))


def cached_reader(path: Path, metadata):
    """A FileSystemReader that uses the metadata already read (and never unpickles `.metadata` itself)."""
    from torch.distributed.checkpoint import FileSystemReader

    class CachedMetadataReader(FileSystemReader):
        def __init__(self, path: Path, metadata) -> None:
            super().__init__(str(path))
            self._cached_metadata = metadata

        def read_metadata(self, *args, **kwargs):
            return self._cached_metadata

    return CachedMetadataReader(path, metadata)


class DCPSource(CheckpointSource):
    def __init__(self, path: Path) -> None:
        super().__init__(format_name="torch DCP (torch.distributed.checkpoint)", root=path, ties_from_config=True)
        self._metadata = read_metadata(path)
        md = self._metadata
        tensor_fqns = [fqn for fqn, item in md.state_dict_metadata.items() if is_tensor_item(item)]
        skipped = [fqn for fqn, item in md.state_dict_metadata.items() if not is_tensor_item(item)]
        out_to_fqn = output_names(self._metadata, tensor_fqns, self.notes)
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")
        self.layout = check_dcp_layout(path, md, set(out_to_fqn.values()))
        self.files = [*self.layout.files, path / METADATA_FILE]
        self.world_size = self.layout.world_size
        self.checks.extend(self.layout.checks)
        for out_name, fqn in out_to_fqn.items():
            item = md.state_dict_metadata[fqn]
            meta = torch.empty(tuple(item.size), dtype=item.properties.dtype, device="meta")
            self.tensors.append(torch_tensor(out_name, meta, self._segments(fqn, meta)))

    def _segments(self, fqn: str, meta: torch.Tensor) -> list[Segment]:
        chunks = self.layout.chunks[fqn]
        nbytes = meta.numel() * meta.element_size()
        if any(c.transformed for c in chunks):
            return [materialised(nbytes, lambda: self._load_with_dcp(fqn, meta))]
        if all(c.is_row_block for c in chunks):
            return [RecordRange(c.record, c.data_offset, c.nbytes)
                    for c in sorted(chunks, key=lambda c: c.offsets[0] if c.offsets else 0)]
        return [materialised(nbytes, lambda: self._assemble(fqn, meta))]

    def _assemble(self, fqn: str, entry: torch.Tensor) -> torch.Tensor:
        """A tensor whose chunks are not row blocks: place each checked chunk at its offsets, as DCP does."""
        out = torch.empty(entry.shape, dtype=entry.dtype)
        for chunk in self.layout.chunks[fqn]:
            span = chunk.storage_span_bytes
            raw = torch.empty(span, dtype=torch.uint8)
            self.reader.read(chunk.record, chunk.data_offset, memoryview(raw.numpy()))
            local = torch.as_strided(raw.view(entry.dtype), chunk.sizes, chunk.strides)
            target = out
            for dim, (start, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
                target = target.narrow(dim, start, size)
            target.copy_(local)
        return out

    def _load_with_dcp(self, fqn: str, entry: torch.Tensor) -> torch.Tensor:
        """Items written through DCP storage transforms: DCP's own loader undoes them (no checksum to check)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import (
            CheckpointException,  # a BaseException, not an Exception
        )

        target = {fqn: torch.empty(entry.shape, dtype=entry.dtype)}
        try:
            with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
                warnings.simplefilter("ignore", UserWarning)
                metadata = read_metadata(self.root, real=True)
                dcp.load(target, storage_reader=cached_reader(self.root, metadata), no_dist=True)
        except (Exception, CheckpointException) as exc:
            _reraise_interrupt(exc)
            raise AccelkitError(f"cannot read tensor {fqn!r} from {self.root}: a shard is corrupt "
                                f"({_first_line(exc)})",
                                hint="re-copy the checkpoint's .distcp files from the machine that wrote them") \
                from None
        return target[fqn]


def _reraise_interrupt(exc: BaseException) -> None:
    """DCP wraps every failure, Ctrl-C included, in a CheckpointException; let an interrupt stay one."""
    for wrapped in getattr(exc, "failures", {}).values():
        if isinstance(wrapped[0], KeyboardInterrupt):
            raise KeyboardInterrupt from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return clip(text.splitlines()[-1] if text else type(exc).__name__, 200)

