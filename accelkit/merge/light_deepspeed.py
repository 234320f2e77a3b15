"""A DeepSpeed ZeRO-1/2/3 checkpoint read without torch, when every check of the torch path can be made here.

The fp32 master weights a merge writes are byte ranges of each rank's flat partition (see deepspeed: ZeRO-1/2 cut
each group's flat vector into consecutive partitions, ZeRO-3 cut every parameter on its own), so the merge is a
sequence of range copies, as for DCP. `plan` reads every model- and optimizer-states pickle through light_pickle
(plain tensors, state dicts and inert stand-ins for the four DeepSpeed classes; nothing imported, no pickled code
runs), checks each file's pickle and small records against their CRC-32, and makes every check `DeepSpeedSource`
and deepspeed_layout make, the same way: one world size and ZeRO stage in every rank file, partition sizes against
`param_shapes`, `global_steps` across files and against a `global_step<N>` tag, the optimizers' own step counters
(read through their CRC-32), every rank's `param_slice_mappings`, and, for ZeRO-1/2, sampled elements of every
partition against the module weights. It returns where every byte of the output is (a light_dcp.CheckpointSource).

Anything it cannot read or prove, and every failed check, raises `Unproven`: the torch path then merges the folder
or refuses it with its own message, so a refusal reads the same on either path.
"""

from __future__ import annotations

import math
import os
import struct
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.merge import deepspeed_layout as layout
from accelkit.merge.dtypes import LIGHT, SCANNED, TABLE
from accelkit.merge.light_dcp import Unproven, read_torch_archive
from accelkit.merge.light_pickle import Refused, TensorRef, load_deepspeed_pickle
from accelkit.merge.records import RecordReader, Window, ZipRecord
from accelkit.merge.source import CheckpointSource, RecordRange, Tensor


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
            raise Unproven(f"{self.path.name}: a tensor's bytes are not where its pickle says")
        return record, tensor.storage_offset * itemsize


def read_archive(path: Path) -> _Archive:
    """A torch.save zip file's structure; its pickle and small records checked against their CRC-32 first."""
    fd = os.open(path, os.O_RDONLY)
    try:
        length = os.fstat(fd).st_size
        window = Window(fd, 0, length, path)
        if not zipfile.is_zipfile(window):
            raise Unproven(f"{path.name} is not a zip archive")
        pickled, data = read_torch_archive(fd, path, 0, length)
    finally:
        os.close(fd)
    return _Archive(path, load_deepspeed_pickle(pickled), data)


def plan(path: Path, tag: str | None, reader: RecordReader) -> CheckpointSource:
    """Where every byte of the merged fp32 weights is, and the step counters read (see the module docstring)."""
    try:
        return _Planner(path, tag, reader).run()
    except (Refused, Unproven):
        raise
    except Exception as exc:  # a failed check, a truncated pickle, an odd zip: the torch path says what is wrong
        raise Unproven(f"{type(exc).__name__}: {exc}") from None


class _Planner:
    def __init__(self, path: Path, tag: str | None, reader: RecordReader) -> None:
        self.reader = reader
        self.tag_dir, how = layout.resolve_tag_dir(path, tag)
        self.out = CheckpointSource(root=self.tag_dir, notes=[f"DeepSpeed checkpoint folder {self.tag_dir} ({how})"])
        self.aliases: dict[str, str] = {}

    def run(self) -> CheckpointSource:
        self.out.format_name = "DeepSpeed ZeRO"
        optim_paths = layout.ranked(self.tag_dir, layout.OPTIM, "*_optim_states.pt")
        self.optim = [read_archive(p) for p in optim_paths]
        states = [self._optim_state(a) for a in self.optim]
        if states[0].get("zero_stage") is None or states[0].get("partition_count") is None:
            raise Unproven("not a ZeRO optimizer state")
        self.stage = int(layout.enum_value(states[0]["zero_stage"]))
        self.out.format_name = f"DeepSpeed ZeRO-{self.stage}"
        world = layout.world_size(states[0])
        if world != len(optim_paths) or any(layout.world_size(s) != world
                                            or int(layout.enum_value(s.get("zero_stage"))) != self.stage
                                            for s in states[1:]):
            raise Unproven("rank files of different world sizes or runs")
        self.world, self.states = world, states
        if self.stage == 3:
            model_paths = layout.ranked(self.tag_dir, layout.ZERO3_MODEL, "zero_pp_rank_*_model_states.pt")
            if len(model_paths) != world:
                raise Unproven("model-state files of another world size")
        else:
            model_paths = [self.tag_dir / layout.ZERO12_MODEL_FILE]
        self.models = [read_archive(p) for p in model_paths]
        self.model_states = [self._model_state(a) for a in self.models]
        self.out.files = [*model_paths, *optim_paths]
        self.out.world_size = world
        self._plan()
        layout.check_zero_files(self._rank_files(), self.out.checks, self.out.step_counters)
        return self.out

    # -- the pickles, as DeepSpeedSource reads them ------------------------------------------------------------
    @staticmethod
    def _optim_state(archive: _Archive) -> dict[str, Any]:
        sd = archive.obj
        if not isinstance(sd, dict) or not isinstance(sd.get("optimizer_state_dict"), dict):
            raise Unproven(f"{archive.path.name} is not a ZeRO optimizer state")
        return sd["optimizer_state_dict"]

    @staticmethod
    def _model_state(archive: _Archive) -> dict[str, Any]:
        sd = archive.obj
        if not isinstance(sd, dict) or "param_shapes" not in sd or "buffer_names" not in sd:
            raise Unproven(f"{archive.path.name} is not a DeepSpeed model state")
        return sd

    def _flat_groups(self, rank: int) -> list[TensorRef]:
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        groups = self.states[rank].get(key)
        if not isinstance(groups, list) or not all(isinstance(g, TensorRef) and len(g.shape) == 1 for g in groups):
            raise Unproven(f"no flat fp32 partitions ({key})")
        return groups

    # -- planning: where every tensor comes from (DeepSpeedSource._plan) ----------------------------------------
    def _plan(self) -> None:
        ms = self.model_states[0]
        self.where: dict[str, tuple] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        self.flats = [self._flat_groups(r) for r in range(self.world)]
        rank_sizes = [[g.numel for g in flats] for flats in self.flats]
        if any(len(sizes) != len(rank_sizes[0]) for sizes in rank_sizes) or (
                self.stage == 3 and any(sizes != rank_sizes[0] for sizes in rank_sizes)):
            raise Unproven("partitions of other sizes across ranks")
        fp32 = self.flats[0][0].storage.dtype if rank_sizes[0] else "float32"
        if self.stage == 3:
            self._plan_zero3(ms, rank_sizes[0], shapes)
        else:
            self._plan_zero12(ms, rank_sizes, shapes)
        def frozen_dtype(name: str) -> str:
            fragment = (ms.get("frozen_param_fragments") or {}).get(name)
            if not isinstance(fragment, TensorRef):
                raise Unproven(f"frozen parameter {name} has no fragment")
            return fragment.storage.dtype

        def shape_dtype(value: Any) -> tuple[tuple, str]:
            tensor = self._tensor(value)
            return tuple(tensor.shape), tensor.storage.dtype

        plan = layout.plan_tensors(ms, self.stage, self.where, shapes, fp32, frozen_dtype=frozen_dtype,
                                   shape_dtype=shape_dtype, is_tensor=lambda value: isinstance(value, TensorRef))
        self.where, self.aliases = plan.where, plan.aliases
        shapes, dtypes = plan.shapes, plan.dtypes
        if plan.from_module:
            self.out.notes.append(layout.module_only_note(plan.from_module))
        for name in plan.order:
            if dtypes[name] not in LIGHT:
                raise Unproven(f"dtype {dtypes[name]} of {name}")
            tensor = Tensor(name, dtypes[name], tuple(shapes[name]), [])
            tensor.segments = [p for p in self._pieces(name, tensor) if p.nbytes]
            if sum(p.nbytes for p in tensor.segments) != tensor.nbytes:
                raise Unproven(f"the bytes of {name} do not add up to its shape")
            self.out.tensors.append(tensor)
        self.out.aliases = dict(self.aliases)

    @staticmethod
    def _tensor(value: Any) -> TensorRef:
        if not isinstance(value, TensorRef):
            raise Unproven("a module entry that is not a plain tensor")
        return value

    def _plan_zero12(self, ms: dict[str, Any], rank_sizes: list[list[int]], shapes: dict) -> None:
        self.partitions = layout.zero12_fragment_ranges(rank_sizes)
        try:
            where, planned = layout.plan_zero12(ms["param_shapes"], rank_sizes,
                                                self.states[0].get("param_alignment_paddings"))
        except layout.LayoutMismatch as exc:
            raise Unproven(str(exc)) from None
        self.where.update(where)
        shapes.update(planned)

    def _plan_zero3(self, ms: dict[str, Any], part_sizes: list[int], shapes: dict) -> None:
        self.partitions = []  # ZeRO-3 partitions every parameter itself
        try:
            where, planned = layout.plan_zero3(ms["param_shapes"], part_sizes, self.world)
        except layout.LayoutMismatch as exc:
            raise Unproven(str(exc)) from None
        self.where.update(where)
        shapes.update(planned)

    # -- where the bytes are (DeepSpeedSource.segments) ----------------------------------------------------------
    def _slice(self, archive: _Archive, tensor: TensorRef, begin: int, end: int) -> list[RecordRange]:
        if end <= begin:
            return []
        if not tensor.is_contiguous:
            raise Unproven(f"a non-contiguous tensor in {archive.path.name}")
        record, offset = archive.locate(tensor)
        size = TABLE[tensor.storage.dtype].itemsize
        start, nbytes = offset + begin * size, (end - begin) * size
        if start + nbytes > record.size:
            raise Unproven(f"a tensor of {archive.path.name} reaches past its record")
        return [RecordRange(record, start, nbytes)]

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

    # -- the checks (deepspeed_layout), read without torch ------------------------------------------------------
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
        """The value of a one-element tensor, read through its record's CRC-32 (as torch_files.materialise)."""
        if tensor.numel != 1 or tensor.storage.dtype not in _FORMATS:
            raise Unproven("a step counter that is not one number")
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



_FORMATS = {"float32": "<f", "float64": "<d", "float16": "<e", "int64": "<q", "int32": "<i"}


def _value(raw: bytes, dtype: str) -> float | int:
    """One element's value, as torch's `.item()` gives it."""
    if dtype == "bfloat16":
        return struct.unpack("<f", b"\0\0" + raw)[0]
    return struct.unpack(_FORMATS[dtype], raw)[0]


def _cast(value: bytes, source: str, target: str) -> bytes:
    """A float32 element cast to `target` bit for bit as torch's `.to` does (round to nearest even); NaN and
    dtypes it does not know go to the torch path."""
    if source == target:
        return value
    if source != "float32":
        raise Unproven(f"a {source} partition")
    bits = struct.unpack("<I", value)[0]
    if bits & 0x7F800000 == 0x7F800000 and bits & 0x007FFFFF:
        raise Unproven("a NaN in a partition")
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
    raise Unproven(f"module weights of dtype {target}")

