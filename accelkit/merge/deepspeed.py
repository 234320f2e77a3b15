"""The one reader of DeepSpeed ZeRO-1/2/3 checkpoints (`engine.save_checkpoint`): every tensor as byte ranges.

`<dir>/latest` names a tag; `<dir>/<tag>/` holds the model states (`mp_rank_00_model_states.pt` for ZeRO-1/2,
`zero_pp_rank_{r}_mp_rank_00_model_states.pt` per rank for ZeRO-3: parameter names and shapes, buffers, frozen
parameters, shared (tied) parameters) and one `*_optim_states.pt` per rank holding that rank's slice of the flat fp32
master weights:

- ZeRO-1/2: per parameter group, the flat vector of all parameters (each followed by its alignment padding) is cut
  into `world_size` consecutive partitions; rank r holds partition r. Partitions are usually equal, but not always
  (a small group of 1602 values splits 802/800 on 2 ranks), so each rank's start is the sum of the sizes before it.
- ZeRO-3: every parameter is cut on its own into `world_size` slices of ceil(numel / world_size) elements (the last
  padded); rank r's flat group concatenates its slice of every parameter.

The output is the fp32 master weights (what the optimizer trains), plus buffers and frozen parameters as saved: byte
ranges of the ranks' records, so the merge is a sequence of range copies. Every pickle is read through light_pickle
(plain tensors, state dicts and inert stand-ins for the four DeepSpeed classes; nothing imported, no pickled code
runs) after its CRC-32; a file that reader cannot build is opened with torch's `weights_only` loader (which also says
what is wrong with a corrupt one). Every check deepspeed_layout defines is made once, with its message: one world size
and ZeRO stage in every rank file, partition sizes against `param_shapes`, `global_steps` across files and against a
`global_step<N>` tag, the optimizers' own step counters, every rank's `param_slice_mappings`, and, for ZeRO-1/2,
sampled elements of every partition against the module weights.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.merge import deepspeed_layout as layout
from accelkit.merge.dtypes import SCANNED, TABLE, name_of
from accelkit.merge.light_pickle import StorageRef, TensorRef, load_deepspeed_pickle
from accelkit.merge.records import RecordReader, Unproven, Window, ZipRecord, input_read_error, read_torch_archive
from accelkit.merge.source import CheckpointSource, RecordRange, Segment, Tensor


@dataclass
class _Archive:
    """One torch.save file of the checkpoint: its pickled structure (TensorRefs for tensors) and data records."""

    path: Path
    obj: Any
    records: dict[str, ZipRecord]  # storage key -> its data record

    def locate(self, tensor: TensorRef) -> tuple[ZipRecord, int]:
        """The record holding a tensor's storage, and the byte offset of its first element (as TorchArchive)."""
        record = self.records.get(tensor.storage.key)
        itemsize = TABLE[tensor.storage.dtype].itemsize
        if record is None or record.size != tensor.storage.numel * itemsize:
            raise AccelkitError(f"{self.path} is corrupt: a tensor's bytes are not where its pickle says",
                                hint="re-copy this file from the machine that wrote the checkpoint")
        return record, tensor.storage_offset * itemsize


def read_archive(path: Path) -> _Archive:
    """A torch.save zip file's structure; its pickle and small records checked against their CRC-32 first."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise input_read_error(exc, path) from None
    try:
        length = os.fstat(fd).st_size
        if not zipfile.is_zipfile(Window(fd, 0, length, path)):
            raise Unproven(f"{path.name} is not a zip archive")
        pickled, data = read_torch_archive(fd, path, 0, length)
        return _Archive(path, load_deepspeed_pickle(pickled), data)
    except AccelkitError:
        raise
    except Exception:  # Unproven, Refused, an odd zip: torch reads it, or says what is wrong with it
        return _read_with_torch(path)
    finally:
        os.close(fd)


def _read_with_torch(path: Path) -> _Archive:
    """A file the torch-free unpickler does not build, opened with torch's `weights_only` loader on the meta device,
    its tensors turned into the same TensorRefs (keyed by their record's offset)."""
    import torch

    from accelkit.merge.torch_files import open_archive

    archive = open_archive(path)
    if archive.legacy:
        raise AccelkitError(f"{path} is a legacy (pre-zip) torch file, which DeepSpeed ZeRO never writes",
                            hint="point at a checkpoint written by engine.save_checkpoint")
    records: dict[str, ZipRecord] = {}

    def convert(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            record, offset = archive.locate(value)
            dtype = name_of(value.dtype)
            key = str(record.offset)
            records[key] = record
            return TensorRef(StorageRef(key, dtype, record.size // value.element_size()),
                             offset // value.element_size(), tuple(value.shape), tuple(value.stride()))
        if isinstance(value, dict):
            return {k: convert(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(convert(v) for v in value)
        return value

    return _Archive(path, convert(archive.obj), records)


def open_deepspeed(path: Path, tag: str | None, reader: RecordReader) -> CheckpointSource:
    """Every tensor of the merged fp32 weights and where its bytes are, with every check made."""
    return _Planner(path, tag, reader).run()


def _refuse_count(tag_dir: Path, paths: list[Path], world: int, what: str) -> None:
    """As many rank files as the run had ranks: fewer is a file missing (named), more is a larger run's file."""
    if len(paths) == world:
        return
    if len(paths) < world:  # the ranks are numbered without gaps (ranked()): the last ones are gone
        ranks = list(range(len(paths), world))
        missing = [paths[0].name.replace("zero_pp_rank_0_", f"zero_pp_rank_{rank}_", 1) for rank in ranks] \
            if paths else []
        listed = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        raise AccelkitError(f"{tag_dir}: the {what} file of rank {', '.join(map(str, ranks[:3]))}"
                            f"{' and more' if len(ranks) > 3 else ''} is missing ({listed}): the run had {world} "
                            f"ranks, the folder holds {len(paths)} {what} file(s)",
                            hint="copy the complete checkpoint folder again (every rank's files), or restore the "
                                 "missing file")
    extra = [p.name for p in paths[world:]]
    raise AccelkitError(f"{tag_dir} holds {len(paths)} {what} files but the run had {world} ranks: "
                        f"{', '.join(extra[:3])} come(s) from a larger run (different world sizes are mixed)",
                        hint="copy the complete checkpoint of one run into a clean folder")


class _Planner:
    def __init__(self, path: Path, tag: str | None, reader: RecordReader) -> None:
        self.reader = reader
        self.tag_dir, how = layout.resolve_tag_dir(path, tag)
        self.out = CheckpointSource(root=self.tag_dir, notes=[f"DeepSpeed checkpoint folder {self.tag_dir} ({how})"],
                                    reader=reader)
        self.aliases: dict[str, str] = {}

    def run(self) -> CheckpointSource:
        self.out.format_name = "DeepSpeed ZeRO"
        optim_paths = layout.ranked(self.tag_dir, layout.OPTIM, "*_optim_states.pt")
        self.optim = [read_archive(p) for p in optim_paths]
        head = self._optim_state(self.optim[0])
        if head.get("zero_stage") is None or head.get("partition_count") is None:
            raise AccelkitError(f"{optim_paths[0]} has no zero_stage/partition_count: not a ZeRO optimizer state",
                                hint="merge-ckpt reads checkpoints written by engine.save_checkpoint with ZeRO 1-3")
        self.stage = int(layout.enum_value(head["zero_stage"]))
        world = layout.world_size(head)
        _refuse_count(self.tag_dir, optim_paths, world, "optimizer")
        self.out.format_name = f"DeepSpeed ZeRO-{self.stage}"
        if self.stage == 3:
            model_paths = layout.ranked(self.tag_dir, layout.ZERO3_MODEL, "zero_pp_rank_*_model_states.pt")
            _refuse_count(self.tag_dir, model_paths, world, "model-state")
        else:
            model_paths = [self.tag_dir / layout.ZERO12_MODEL_FILE]
        self.models = [read_archive(p) for p in model_paths]
        self.states = [head]
        for archive in self.optim[1:]:
            other = self._optim_state(archive)
            other_world, other_stage = layout.world_size(other), int(layout.enum_value(other.get("zero_stage")))
            if other_world != world or other_stage != self.stage:
                raise AccelkitError(f"{archive.path.name} comes from a different run (world size {other_world}, "
                                    f"ZeRO-{other_stage}) than {optim_paths[0].name} (world size {world}, "
                                    f"ZeRO-{self.stage}): shards from different world sizes or runs are mixed",
                                    hint="copy the complete checkpoint of one run into a clean folder")
            self.states.append(other)
        self.world = world
        self.model_states = [self._model_state(a) for a in self.models]
        self.out.files = [*model_paths, *optim_paths]
        self.out.world_size = world
        self._plan()
        layout.check_zero_files(self._rank_files(), self.out.checks, self.out.step_counters)
        return self.out

    # -- the pickles ------------------------------------------------------------------------------------------
    @staticmethod
    def _optim_state(archive: _Archive) -> dict[str, Any]:
        sd = archive.obj
        if not isinstance(sd, dict) or not isinstance(sd.get("optimizer_state_dict"), dict):
            raise AccelkitError(f"{archive.path} is not a DeepSpeed ZeRO optimizer state file", hint=_WRITTEN_BY)
        return sd["optimizer_state_dict"]

    @staticmethod
    def _model_state(archive: _Archive) -> dict[str, Any]:
        sd = archive.obj
        if not isinstance(sd, dict) or "param_shapes" not in sd or "buffer_names" not in sd:
            raise AccelkitError(f"{archive.path} is not a DeepSpeed model state file", hint=_WRITTEN_BY)
        return sd

    def _flat_groups(self, rank: int) -> list[TensorRef]:
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        groups = self.states[rank].get(key)
        if not isinstance(groups, list) or not all(isinstance(g, TensorRef) and len(g.shape) == 1 for g in groups):
            raise AccelkitError(f"{self.optim[rank].path} holds no flat fp32 partitions ({key})", hint=_WRITTEN_BY)
        return groups

    # -- planning: where every tensor comes from ----------------------------------------------------------------
    def _plan(self) -> None:
        ms = self.model_states[0]
        self.flats = [self._flat_groups(r) for r in range(self.world)]
        rank_sizes = [[g.numel for g in flats] for flats in self.flats]
        if any(len(sizes) != len(rank_sizes[0]) for sizes in rank_sizes) or (
                self.stage == 3 and any(sizes != rank_sizes[0] for sizes in rank_sizes)):
            odd = next(r for r, sizes in enumerate(rank_sizes) if sizes != rank_sizes[0])
            raise AccelkitError(f"{self.optim[odd].path.name} holds partitions of other sizes than "
                                f"{self.optim[0].path.name}: they come from different runs",
                                hint="copy the complete checkpoint of one run")
        fp32 = self.flats[0][0].storage.dtype if rank_sizes[0] else "float32"
        try:
            if self.stage == 3:
                self.partitions = []  # ZeRO-3 partitions every parameter itself
                where, shapes = layout.plan_zero3(ms["param_shapes"], rank_sizes[0], self.world)
            else:
                self.partitions = layout.zero12_fragment_ranges(rank_sizes)
                where, shapes = layout.plan_zero12(ms["param_shapes"], rank_sizes,
                                                   self.states[0].get("param_alignment_paddings"))
        except layout.LayoutMismatch as exc:
            raise AccelkitError(f"{self.tag_dir}: {exc}",
                                hint="the model and optimizer files come from different runs") from None

        def frozen_dtype(name: str) -> str:
            fragment = (ms.get("frozen_param_fragments") or {}).get(name)
            if not isinstance(fragment, TensorRef):
                raise AccelkitError(f"{self.models[0].path} holds no fragment of the frozen parameter {name}",
                                    hint=_WRITTEN_BY)
            return fragment.storage.dtype

        def shape_dtype(value: Any) -> tuple[tuple, str]:
            tensor = self._tensor(value)
            return tuple(tensor.shape), tensor.storage.dtype

        plan = layout.plan_tensors(ms, self.stage, dict(where), dict(shapes), fp32, frozen_dtype=frozen_dtype,
                                   shape_dtype=shape_dtype, is_tensor=lambda value: isinstance(value, TensorRef))
        self.where, self.aliases = plan.where, plan.aliases
        shapes, dtypes = plan.shapes, plan.dtypes
        if plan.from_module:
            self.out.notes.append(layout.module_only_note(plan.from_module))
        for name in plan.order:
            tensor = Tensor(name, dtypes[name], tuple(shapes[name]), [])
            tensor.segments = [p for p in self._pieces(name, tensor) if p.nbytes]
            self.out.tensors.append(tensor)
        self.out.aliases = dict(self.aliases)

    def _tensor(self, value: Any) -> TensorRef:
        if not isinstance(value, TensorRef):
            raise AccelkitError(f"{self.models[0].path} holds a module entry that is not a tensor", hint=_WRITTEN_BY)
        return value

    # -- where the bytes are ----------------------------------------------------------------------------------------
    def _slice(self, archive: _Archive, tensor: TensorRef, begin: int, end: int) -> list[Segment]:
        if end <= begin:
            return []
        record, offset = archive.locate(tensor)
        size = TABLE[tensor.storage.dtype].itemsize
        if tensor.is_contiguous:  # the reader checks that the range lies inside its record
            return [RecordRange(record, offset + begin * size, (end - begin) * size)]
        from accelkit.merge.torch_files import materialised, strided  # torch: no byte range covers it

        return [materialised((end - begin) * size, lambda: strided(self.reader, record, offset, tensor.storage.dtype,
                                                                  tensor.shape, tensor.stride).reshape(-1)[begin:end])]

    def _rank_range(self, rank: int, start: int, length: int, group: int | None) -> list[RecordRange]:
        flats = self.flats[rank]
        chosen = list(range(len(flats))) if group is None else [group]
        out, base = [], 0
        for g in chosen:
            n = flats[g].numel
            lo, hi = max(start, base), min(start + length, base + n)
            if lo < hi:
                out += self._slice(self.optim[rank], flats[g], lo - base, hi - base)
            base += n
        return out

    def _pieces(self, name: str, tensor: Tensor) -> list[RecordRange]:
        where = self.where[name]
        kind = where[0]
        ms = self.model_states[0]
        if kind == "module":
            ref = self._tensor(ms["module"][name])
            return self._slice(self.models[0], ref, 0, ref.numel)
        if kind == "frozen":
            if self.stage < 3:
                ref = self._tensor(ms["frozen_param_fragments"][name])
                return self._slice(self.models[0], ref, 0, ref.numel)
            out, left = [], math.prod(tensor.shape)
            for rank, state in enumerate(self.model_states):
                fragment = self._tensor((state.get("frozen_param_fragments") or {}).get(name))
                take = min(left, fragment.numel)
                out += self._slice(self.models[rank], fragment, 0, take)
                left -= take
            return out
        out = []
        for rank, start, length, group in layout.parameter_ranges(where, self.partitions, self.world):
            out += self._rank_range(rank, start, length, group)
        return out

    # -- the checks (deepspeed_layout) ----------------------------------------------------------------------------
    def _rank_files(self) -> layout.ZeroRankFiles:
        def scalar(rank: int, value: Any) -> Any:
            return self._item(self.optim[rank], value) if isinstance(value, TensorRef) else value

        def sample(rank: int, flat: TensorRef, index: int, weights: TensorRef,
                   weights_index: int) -> tuple[bool, str, str]:
            master = self._peek(self.optim[rank], flat, index)
            copy = self._peek(self.models[0], weights, weights_index)
            same = _cast(master, flat.storage.dtype, weights.storage.dtype) == copy
            return same, repr(_value(master, flat.storage.dtype)), repr(_value(copy, weights.storage.dtype))

        def samplable(weights: Any, numel: int) -> bool:
            return (isinstance(weights, TensorRef) and weights.storage.dtype in SCANNED and weights.numel == numel
                    and weights.is_contiguous)

        return layout.ZeroRankFiles(
            tag=self.tag_dir.name, stage=self.stage, world=self.world, model_files=self.out.files[:len(self.models)],
            model_states=self.model_states, optim_files=[a.path for a in self.optim], optim_states=self.states,
            where=self.where, partitions=self.partitions, flats=self.flats, scalar=scalar, sample=sample,
            samplable=samplable)

    def _item(self, archive: _Archive, tensor: TensorRef) -> float | int:
        """The value of a one-element tensor, read through its record's CRC-32."""
        if tensor.numel != 1 or tensor.storage.dtype not in _FORMATS:
            raise AccelkitError(f"{archive.path} holds a step counter that is not one number", hint=_WRITTEN_BY)
        record, offset = archive.locate(tensor)
        raw = bytearray(TABLE[tensor.storage.dtype].itemsize)
        self.reader.read(record, offset, memoryview(raw))
        return _value(bytes(raw), tensor.storage.dtype)

    def _peek(self, archive: _Archive, tensor: TensorRef, index: int) -> bytes:
        record, offset = archive.locate(tensor)
        size = TABLE[tensor.storage.dtype].itemsize
        raw = bytearray(size)
        self.reader.peek(record, offset + index * size, memoryview(raw))
        return bytes(raw)



_WRITTEN_BY = "point at a checkpoint written by engine.save_checkpoint"
_FORMATS = {"float32": "<f", "float64": "<d", "float16": "<e", "int64": "<q", "int32": "<i", "int16": "<h",
            "int8": "<b", "uint8": "<B", "bool": "?", "bfloat16": "<f"}


def _value(raw: bytes, dtype: str) -> float | int:
    """One element's value, as torch's `.item()` gives it."""
    if dtype == "bfloat16":
        return struct.unpack("<f", b"\0\0" + raw)[0]
    return struct.unpack(_FORMATS[dtype], raw)[0]


def _cast(value: bytes, source: str, target: str) -> bytes:
    """An element cast to `target` bit for bit as torch's `.to` does (round to nearest even): float32 without torch,
    the rest (a NaN, other dtypes) with it."""
    if source == target:
        return value
    bits = struct.unpack("<I", value)[0] if source == "float32" else 0
    if source == "float32" and not (bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF):
        if target == "bfloat16":
            return struct.pack("<H", ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)
        if target == "float64":
            return struct.pack("<d", struct.unpack("<f", value)[0])
        if target == "float16":
            number = struct.unpack("<f", value)[0]
            try:
                return struct.pack("<e", number)  # IEEE round to nearest even, as the C cast torch uses
            except OverflowError:
                return struct.pack("<H", 0x7C00 if number > 0 else 0xFC00)
    import torch

    element = torch.frombuffer(bytearray(value), dtype=getattr(torch, source))
    return element.to(getattr(torch, target)).view(torch.uint8).numpy().tobytes()
