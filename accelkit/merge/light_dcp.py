"""A DCP folder read without torch, when its layout can be proven to be plain byte ranges of the output.

FSDP shards every tensor by rows and DCP stores each shard as one contiguous tensor in a `torch.save` item, so the
output tensor's bytes are its chunks' data records' bytes back to back: the merge is a sequence of range copies.
`plan` proves that from the files and returns where every byte is. The checks of `.metadata` against the folder
that read no tensor (items tile their files exactly, no stray shard, chunks cover their tensor) are defined here
once, with their messages, and dcp makes them too; the items are read here as zip archives whose pickle and
small records pass their CRC-32, holding one tensor of the dtype and shape `.metadata` names, whose bytes lie
inside its record. Anything it cannot prove (another layout, a storage transform, a dtype or class it does not
know, or a check that fails) raises `Unproven`: the torch path then merges the folder, or refuses it with the same
message. Reading `.metadata` and the items' pickles goes through light_pickle: no pickled code runs.
"""

from __future__ import annotations

import io
import math
import os
import re
import zipfile
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.merge.dtypes import LIGHT, TABLE
from accelkit.merge.light_pickle import DType, Refused, TensorRef, load_archive_pickle, load_metadata
from accelkit.merge.records import Window, ZipRecord, crc32, input_read_error, local_data_offset, pread_into
from accelkit.merge.source import CheckpointSource, RecordRange, Tensor

METADATA_FILE = ".metadata"
DISTCP = re.compile(r"^__(\d+)_(\d+)\.distcp$")
RECOPY = "re-copy the checkpoint directory from the machine that wrote it"
ONE_SAVE = "copy the checkpoint into a clean directory with only the files of one save"
_MODEL_KEYS = ("model", "module", "state_dict")  # the top-level keys a model is nested under


class Unproven(Exception):
    """The folder's layout could not be proven to be plain byte ranges: the torch path merges it."""


def plan(path: Path) -> CheckpointSource:
    """Where every byte of every tensor of the DCP folder `path` is (see the module docstring)."""
    try:
        return _plan(path)
    except (Refused, Unproven):
        raise
    except Exception as exc:  # a truncated pickle, an odd zip, a missing file: the torch path says what is wrong
        raise Unproven(f"{type(exc).__name__}: {exc}") from None


def _plan(path: Path) -> CheckpointSource:
    metadata = load_metadata((path / METADATA_FILE).read_bytes())
    items = metadata.state_dict_metadata
    if not isinstance(items, dict):
        raise Unproven("state_dict_metadata is not a dict")
    tensor_fqns = [fqn for fqn, item in items.items() if type(item).__name__ == "TensorStorageMetadata"]
    skipped = [fqn for fqn in items if fqn not in set(tensor_fqns)]
    out = CheckpointSource(format_name="torch DCP (torch.distributed.checkpoint)", root=path, ties_from_config=True)
    names = output_names(metadata, tensor_fqns, out.notes)
    if skipped:
        out.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")

    by_file, out.world_size = check_storage_files(path, metadata)
    if any(getattr(info, "transform_descriptors", None) for info in metadata.storage_data.values()):
        raise Unproven("items written through storage transforms")
    fds: dict[str, int] = {}
    try:
        for rel in sorted(by_file):
            if not isinstance(rel, str) or "/" in rel or not DISTCP.match(rel):
                raise Unproven(f"storage file {rel!r}")
            fds[rel] = os.open(path / rel, os.O_RDONLY)
            out.files.append(path / rel)
        storage = {(index.fqn, tuple(offset)): info for index, info in metadata.storage_data.items()
                   if (offset := getattr(index, "offset", None)) is not None}
        count = 0
        for out_name, fqn in names.items():
            item = items[fqn]
            dtype = item.properties.dtype
            if not isinstance(dtype, DType) or getattr(item.properties, "layout", "torch.strided") != "torch.strided":
                raise Unproven(f"dtype or layout of {fqn}")
            shape = tuple(item.size)
            chunks = [_open_chunk(path, fds, storage, fqn, chunk, dtype.name, shape) for chunk in item.chunks]
            check_coverage(path, fqn, shape, [(c[3], c[4], True) for c in chunks])
            chunks.sort(key=lambda c: c[0])
            out.tensors.append(Tensor(out_name, dtype.name, shape, [c[2] for c in chunks if c[2].nbytes]))
            count += len(chunks)
    finally:
        for fd in fds.values():
            os.close(fd)
    out.files.append(path / METADATA_FILE)
    out.checks.append(f"{METADATA_FILE} matches the shards: {len(metadata.storage_data)} items tile {len(by_file)} "
                      f"files exactly; {count} tensor items hold the shapes and dtypes it names (pickles and record "
                      "tables CRC-checked)")
    return out


def check_storage_files(path: Path, metadata) -> tuple[dict[str, list[tuple[int, int, object]]], int | None]:
    """`.metadata` against the folder (both paths): every file it names exists and its items tile it exactly, no
    `.distcp` file is left over. The items of each file by offset, and the world size the file names give."""
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
    """Output name -> DCP fqn (both paths): a state dict saved as {"model": model_sd, ...} is unnested to model_sd."""
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
                shape: tuple[int, ...]) -> tuple[int, int, RecordRange, tuple[int, ...], tuple[int, ...]]:
    """(first row, rows, the chunk's bytes) of one chunk: a block of whole rows stored as one contiguous tensor."""
    offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
    if len(offsets) != len(shape) or len(sizes) != len(shape) or any(offsets[1:]) or sizes[1:] != shape[1:]:
        raise Unproven(f"a chunk of {fqn} is not a block of whole rows")
    info = storage.get((fqn, offsets))
    if info is None:
        raise Unproven(f"no storage for a chunk of {fqn}")
    file = path / info.relative_path
    fd = fds[info.relative_path]
    tensor, record = _read_item(fd, file, info.offset, info.length)
    if tensor.storage.dtype != dtype or tensor.shape != sizes or not tensor.is_contiguous:
        raise Unproven(f"the item of {fqn} is not the contiguous {dtype} {list(sizes)} .metadata names")
    itemsize = TABLE[dtype].itemsize
    start, nbytes = tensor.storage_offset * itemsize, tensor.numel * itemsize
    if record.size != tensor.storage.numel * itemsize or start + nbytes > record.size:
        raise Unproven(f"the item of {fqn} reaches past its record")
    first, rows = (offsets[0] if offsets else 0), (sizes[0] if sizes else 1)
    return first, rows, RecordRange(record, start, nbytes), offsets, sizes


def read_torch_archive(fd: int, file: Path, start: int, length: int) -> tuple[bytes, dict[str, ZipRecord]]:
    """A `torch.save` zip archive at [start, start + length) of a file: its pickle, CRC-32 checked, and its data
    records by storage key. Compressed, big-endian or odd archives are Unproven (the torch path reads them)."""
    records: dict[str, ZipRecord] = {}
    with zipfile.ZipFile(io.BufferedReader(Window(fd, start, length, file))) as archive:
        for info in archive.infolist():
            if info.compress_type != zipfile.ZIP_STORED:
                raise Unproven(f"{file.name} has a compressed record")
            offset = local_data_offset(fd, start + info.header_offset, file)
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
        pread_into(fd, memoryview(raw), record.offset, file)
        if crc32(raw) != record.crc:
            raise Unproven(f"CRC-32 of {name}")
        if name == prefix + "byteorder" and bytes(raw) != b"little":
            raise Unproven(f"{file.name} is big-endian")
        if name == pickles[0]:
            pickled = bytes(raw)
    return pickled, data


def _read_item(fd: int, file: Path, start: int, length: int) -> tuple[TensorRef, ZipRecord]:
    """The one tensor of a `torch.save` item at [start, start + length) of a .distcp file, and its data record."""
    pickled, data = read_torch_archive(fd, file, start, length)
    tensor = load_archive_pickle(pickled)
    if not isinstance(tensor, TensorRef) or tensor.storage.dtype not in LIGHT:
        raise Unproven("an item that is not one plain tensor")
    record = data.get(tensor.storage.key)
    if record is None:
        raise Unproven("an item whose tensor has no data record")
    return tensor, record
