"""The one reader of torch DCP folders: `.metadata` checked against its `.distcp` files, every tensor as segments.

torch.distributed.checkpoint (DCP) directories, `.metadata` + `__{rank}_{i}.distcp` files: FSDP1/FSDP2 sharded
state dicts, Accelerate's `pytorch_model_fsdp_0/`, torchtitan-style `{"model": ...}` saves. `.metadata` gives every
tensor's global shape and dtype and, per chunk, the file, byte offset and length of the item holding it; every item
is itself a `torch.save` archive (see records).

What is checked when the folder is opened, before anything is merged, each with its one message:

- `.metadata` is a pickle; it is read with light_pickle's unpickler, which only builds DCP's own metadata classes,
  sizes, dtypes and paths, so a crafted file cannot run code.
- Storage entries: every file named exists, its items tile it exactly (each starts where the previous one ended, the
  last ends at the file's last byte) and no `.distcp` file is left over. A shard from a save with other shapes, a
  truncated or padded file, or metadata from another save fails here.
- Items: each chunk's item is a `torch.save` archive holding one tensor of the chunk's shape and dtype, whose
  pickle and record table carry valid CRC-32s, and whose bytes lie inside its data record; the chunks cover their
  tensor exactly.

FSDP shards tensors by rows and stores each shard as one contiguous tensor, so a tensor's bytes are its chunks' data
records' bytes back to back: record ranges, copied without torch. The items' pickles are read without torch too;
torch reads only what that reader cannot (an item whose pickle names a class it does not build, or that is corrupt:
torch's `weights_only` loader then says what is wrong), and builds what no byte range covers (chunks split along
another dimension or strided, placed as DCP does; items written through storage transforms, loaded with DCP's own
`dcp.load`) as materialised segments.

What this cannot tell apart: a shard from another save with exactly the same shapes (another step of the same run,
or another run of the same model). Those are caught by the Accelerate files beside the model (savestate) or a
manifest (manifest); docs/guides/checkpoint-integrity.md says so per format.
"""

from __future__ import annotations

import math
import os
import pickle
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

from accelkit.errors import AccelkitError, clip
from accelkit.merge.dtypes import COMPLEX, TABLE
from accelkit.merge.light_pickle import MetadataUnpickler, TensorRef, light_dtype, load_archive_pickle
from accelkit.merge.records import (
    RecordReader,
    TorchArchive,
    Unproven,
    ZipRecord,
    input_read_error,
    read_torch_archive,
)
from accelkit.merge.source import CheckpointSource, RecordRange, Segment, Tensor

METADATA_FILE = ".metadata"
DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
RECOPY = "re-copy the checkpoint directory from the machine that wrote it"
ONE_SAVE = "copy the checkpoint into a clean directory with only the files of one save"
FORMAT = "torch DCP (torch.distributed.checkpoint)"
_MODEL_KEYS = ("model", "module", "state_dict")  # the top-level keys a model is nested under


def read_metadata(path: Path, dtype=light_dtype, real: bool = False):
    """`.metadata` of the DCP folder `path`, read without running pickled code (see the module docstring)."""
    file = path / METADATA_FILE
    try:
        with open(file, "rb") as handle:
            metadata = MetadataUnpickler(handle, dtype=dtype, real=real).load()
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
    record: ZipRecord | None = None  # None for items written through storage transforms
    data_offset: int = 0  # byte offset of the chunk's first element in the record
    nbytes: int = 0
    strides: tuple[int, ...] = ()
    span: int = 0  # bytes from the first element to one past the last, as stored
    row_block: bool = False  # a contiguous block of whole rows: its bytes are a slice of the tensor's bytes


def open_dcp(path: Path, reader: RecordReader) -> CheckpointSource:
    """Every tensor of the DCP folder `path` and where its bytes are, with every check made."""
    metadata = read_metadata(path)
    items = metadata.state_dict_metadata
    tensor_fqns = [fqn for fqn, item in items.items() if type(item).__name__ == "TensorStorageMetadata"]
    skipped = [fqn for fqn in items if fqn not in set(tensor_fqns)]
    out = CheckpointSource(format_name=FORMAT, root=path, ties_from_config=True, reader=reader)
    names = output_names(metadata, tensor_fqns, out.notes)
    if skipped:
        out.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")
    by_file, out.world_size = check_storage_files(path, metadata)
    # Non-tensor items (an optimizer's step, param_groups) have no offset: only tensor chunks are looked up by it.
    storage = {(index.fqn, tuple(offset)): info for index, info in metadata.storage_data.items()
               if (offset := getattr(index, "offset", None)) is not None}
    fds: dict[str, int] = {}
    count = 0
    try:
        for out_name, fqn in names.items():
            item = items[fqn]
            dtype, shape = item.properties.dtype.name, tuple(item.size)
            chunks = [_open_chunk(path, fds, storage, fqn, chunk, dtype, shape) for chunk in item.chunks]
            check_coverage(path, fqn, shape, [(c.offsets, c.sizes, c.row_block) for c in chunks])
            tensor = Tensor(out_name, dtype, shape, itemsize=COMPLEX.get(dtype, 0))
            tensor.segments = _segments(path, reader, fqn, tensor, chunks)
            out.tensors.append(tensor)
            count += len(chunks)
    finally:
        for fd in fds.values():
            os.close(fd)
    out.files = [*(path / rel for rel in sorted(by_file)), path / METADATA_FILE]
    out.checks.append(f"{METADATA_FILE} matches the shards: {len(metadata.storage_data)} items tile {len(by_file)} "
                      f"files exactly; {count} tensor items hold the shapes and dtypes it names (pickles and record "
                      "tables CRC-checked)")
    return out


def check_storage_files(path: Path, metadata) -> tuple[dict[str, list[tuple[int, int, object]]], int | None]:
    """`.metadata` against the folder: every file it names exists and its items tile it exactly, no `.distcp` file
    is left over. The items of each file by offset, and the world size the file names give."""
    by_file: dict[str, list[tuple[int, int, object]]] = {}
    for index, info in metadata.storage_data.items():
        by_file.setdefault(info.relative_path, []).append((info.offset, info.length, index))
    for rel in sorted(by_file):
        by_file[rel].sort(key=lambda item: item[0])
        check_tiling(path / rel, by_file[rel])
    strays = sorted(p.name for p in path.iterdir() if DISTCP.match(p.name) and p.name not in by_file)
    if strays:
        raise AccelkitError(f"{path} holds shards not named in its {METADATA_FILE} ({', '.join(strays[:4])}): "
                            "they come from a run with a different world size or step", hint=ONE_SAVE)
    ranks = {int(m.group(1)) for rel in by_file if (m := DISTCP.match(rel))}
    return by_file, (max(ranks) + 1) if ranks else None


def check_tiling(file: Path, items: list[tuple[int, int, object]]) -> None:
    """The items of one file follow each other without gap or overlap, and the file ends where the last one does."""
    try:
        size = file.stat().st_size
    except FileNotFoundError:
        raise AccelkitError(f"shard {file} named in {METADATA_FILE} is missing",
                            hint="copy every rank's .distcp file into the checkpoint directory") from None
    except OSError as exc:
        raise input_read_error(exc, file) from None
    end = max(offset + length for offset, length, _ in items)
    if size < end:
        raise AccelkitError(f"shard {file} is truncated ({size} bytes, {METADATA_FILE} needs at least {end})",
                            hint="re-copy this file from the machine that wrote it")
    position = 0
    for offset, length, index in items:
        if offset != position:
            raise AccelkitError(f"{METADATA_FILE} does not describe shard {file}: its item for "
                                f"{getattr(index, 'fqn', index)} starts at byte {offset}, not {position} (the "
                                f"metadata and the shard come from different saves)", hint=ONE_SAVE)
        position = offset + length
    if size != end:
        raise AccelkitError(f"shard {file} has {size - end} bytes more than {METADATA_FILE} describes: it was written "
                            "by another save", hint=ONE_SAVE)


def check_coverage(path: Path, fqn: str, shape: tuple[int, ...],
                   chunks: list[tuple[tuple[int, ...], tuple[int, ...], bool]]) -> None:
    """The chunks lie inside the tensor and their elements add up to it (overlaps would add up to more)."""
    inside = all(len(offsets) == len(shape) and all(o >= 0 and o + s <= d for o, s, d in
                                                    zip(offsets, sizes, shape, strict=True))
                 for offsets, sizes, _ in chunks)
    covered = inside and sum(math.prod(sizes) for _, sizes, _ in chunks) == math.prod(shape)
    rows = sorted((offsets[0], sizes[0]) for offsets, sizes, row_block in chunks if row_block and offsets)
    if covered and len(rows) == len(chunks):  # row blocks: each starts where the previous one ends
        covered = all(start == prev_start + prev_size
                      for (prev_start, prev_size), (start, _) in zip(rows, rows[1:], strict=False))
    if not covered:
        raise AccelkitError(f"{path / METADATA_FILE}: the chunks of {fqn} do not cover its shape {list(shape)} "
                            "exactly", hint=RECOPY)


def output_names(metadata, fqns: list[str], notes: list[str]) -> dict[str, str]:
    """Output name -> DCP fqn: a state dict saved as {"model": model_sd, ...} is unnested to model_sd."""
    planner = getattr(metadata, "planner_data", None)
    paths = {fqn: tuple(planner.get(fqn, (fqn,))) for fqn in fqns} if planner else {fqn: (fqn,) for fqn in fqns}
    tops = {p[0] for p in paths.values() if len(p) > 1}
    if all(len(p) > 1 for p in paths.values()) and paths:
        top = next((k for k in _MODEL_KEYS if k in tops), None)
        if top is not None:
            others = sorted(tops - {top})
            note = f'tensors are nested under "{top}"; the "{top}." prefix is dropped'
            if others:
                note += f" and {', '.join(others)} entries are skipped"
            notes.append(note)
            return {".".join(str(x) for x in p[1:]): fqn for fqn, p in paths.items() if p[0] == top}
    return {fqn: fqn for fqn in fqns}


def _open_chunk(path: Path, fds: dict[str, int], storage: dict, fqn: str, chunk, dtype: str,
                shape: tuple[int, ...]) -> Chunk:
    offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
    info = storage.get((fqn, offsets))
    if info is None:
        raise AccelkitError(f"{path / METADATA_FILE} lists a chunk of {fqn} at {list(offsets)} but no storage for it",
                            hint=RECOPY)
    if getattr(info, "transform_descriptors", None):
        return Chunk(offsets, sizes)
    file = path / info.relative_path
    what = f"the item of {fqn} in {file}"
    if info.relative_path not in fds:
        try:
            fds[info.relative_path] = os.open(file, os.O_RDONLY)
        except OSError as exc:
            raise input_read_error(exc, file) from None
    try:
        pickled, data = read_torch_archive(fds[info.relative_path], file, info.offset, info.length)
        ref = load_archive_pickle(pickled)
        if not isinstance(ref, TensorRef) or ref.storage.key not in data:
            raise Unproven("an item that is not one plain tensor")
        stored, size = ref.storage.dtype, TABLE[ref.storage.dtype].itemsize
        record, strides, contiguous = data[ref.storage.key], ref.stride, ref.is_contiguous
        if record.size != ref.storage.numel * size:
            raise AccelkitError(f"{file} is corrupt: a tensor's bytes are not where its pickle says",
                                hint="re-copy this file from the machine that wrote the checkpoint")
        data_offset, got = ref.storage_offset * size, ref.shape
    except AccelkitError:
        raise
    except Exception:  # Unproven, Refused, an odd zip: torch reads it (or says what is wrong with it)
        stored, got, record, data_offset, strides, contiguous, size = _open_with_torch(file, info, what)
    if stored != dtype or got != sizes:
        raise AccelkitError(f"{what} is a {stored} tensor of shape {list(got)} but {METADATA_FILE} says {dtype} "
                            f"{list(sizes)}: the shard and {METADATA_FILE} come from different saves", hint=ONE_SAVE)
    span = (1 + sum((n - 1) * s for n, s in zip(sizes, strides, strict=True))) * size if math.prod(sizes) else 0
    if data_offset + span > record.size:
        raise AccelkitError(f"{what} is corrupt: its tensor reaches past its record", hint=RECOPY)
    full_rows = all(o == 0 for o in offsets[1:]) and sizes[1:] == shape[1:]
    return Chunk(offsets, sizes, record, data_offset, math.prod(sizes) * size, strides, span, full_rows and contiguous)


def _open_with_torch(file: Path, info, what: str) -> tuple:
    """An item the torch-free reader does not build, opened with torch's `weights_only` loader."""
    import torch

    archive = TorchArchive.open(file, [], start=info.offset, length=info.length, what=what)
    tensor = archive.obj
    if archive.legacy or not isinstance(tensor, torch.Tensor):
        raise AccelkitError(f"{what} is not a tensor: {file} and {METADATA_FILE} come from different saves",
                            hint=ONE_SAVE)
    record, data_offset = archive.locate(tensor)
    return (str(tensor.dtype).removeprefix("torch."), tuple(tensor.shape), record, data_offset,
            tuple(tensor.stride()), tensor.is_contiguous(), tensor.element_size())


def _segments(path: Path, reader: RecordReader, fqn: str, tensor: Tensor, chunks: list[Chunk]) -> list[Segment]:
    if all(c.row_block for c in chunks):
        return [RecordRange(c.record, c.data_offset, c.nbytes)
                for c in sorted(chunks, key=lambda c: c.offsets[0] if c.offsets else 0) if c.nbytes]
    from accelkit.merge.torch_files import materialised  # torch: what no byte range covers

    if any(c.record is None for c in chunks):
        return [materialised(tensor.nbytes, lambda: _load_with_dcp(path, fqn, tensor))]
    return [materialised(tensor.nbytes, lambda: _assemble(reader, tensor, chunks))]


def _assemble(reader: RecordReader, tensor: Tensor, chunks: list[Chunk]):
    """A tensor whose chunks are not row blocks: place each checked chunk at its offsets, as DCP does."""
    import torch

    dtype = getattr(torch, tensor.dtype)
    out = torch.empty(tensor.shape, dtype=dtype)
    for chunk in chunks:
        raw = torch.empty(chunk.span, dtype=torch.uint8)
        reader.read(chunk.record, chunk.data_offset, memoryview(raw.numpy()))
        local = torch.as_strided(raw.view(dtype), chunk.sizes, chunk.strides)
        target = out
        for dim, (start, size) in enumerate(zip(chunk.offsets, chunk.sizes, strict=True)):
            target = target.narrow(dim, start, size)
        target.copy_(local)
    return out


def _load_with_dcp(path: Path, fqn: str, tensor: Tensor):
    """Items written through DCP storage transforms: DCP's own loader undoes them (no checksum to check)."""
    import torch
    import torch.distributed.checkpoint as torch_dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    class CachedMetadataReader(FileSystemReader):  # the metadata already read: `.metadata` is never unpickled again
        def read_metadata(self, *args, **kwargs):
            return metadata

    target = {fqn: torch.empty(tensor.shape, dtype=getattr(torch, tensor.dtype))}
    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            metadata = read_metadata(path, real=True, dtype=lambda name: dtype if isinstance(
                dtype := getattr(torch, name, None), torch.dtype) else None)
            torch_dcp.load(target, storage_reader=CachedMetadataReader(str(path)), no_dist=True)
    except (Exception, CheckpointException) as exc:
        for wrapped in getattr(exc, "failures", {}).values():  # DCP wraps every failure, Ctrl-C included
            if isinstance(wrapped[0], KeyboardInterrupt):
                raise KeyboardInterrupt from None
        text = str(exc).strip()
        raise AccelkitError(f"cannot read tensor {fqn!r} from {path}: a shard is corrupt "
                            f"({clip(text.splitlines()[-1] if text else type(exc).__name__, 200)})",
                            hint="re-copy the checkpoint's .distcp files from the machine that wrote them") from None
    return target[fqn]

