"""The reader of per-rank torch.save files of a sharded (FSDP2 `fully_shard`) model: one file per rank, each holding
that rank's `state_dict()` of DTensors (local shard, placements, device mesh).

Two tools write them: Accelerate 1.15's `save_fsdp_model(..., use_dcp=False)` with SHARDED_STATE_DICT
(`pytorch_model_fsdp_{i}_rank{r}.bin`, `get_model_state_dict` of the FSDP2 model: DTensors) and RL frameworks such
as verl (`model_world_size_{N}_rank_{R}.pt`, `torch.save(model.state_dict())`). Names are recognised without torch
(`find_rank_files`); the files are then loaded with `weights_only=True` on the meta device, with DTensor's own
classes (DTensor, its spec, the device mesh, Shard and Replicate placements) allowlisted: no other global, no pickled
code. Every rank's file must be there (a mesh of N ranks, N files; verl's names say N too), every DTensor must have
the same mesh, placements, global shape and dtype on every rank, and each local shard the shape its rank's mesh
coordinate gives (torch's chunking: ceil(size / n) per rank, the last ones shorter or empty). A tensor sharded on dim
0 only is its shards' byte ranges back to back, in mesh order; any other sharding is assembled by torch, one tensor
at a time. Placements other than Shard and Replicate (Partial, strided shards) and one dim sharded twice are
refused. The files carry no step: files of two steps with the same shapes are caught only by a manifest.
"""

from __future__ import annotations

import contextlib
import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from accelkit.errors import AccelkitError

if TYPE_CHECKING:
    import torch

    from accelkit.merge.records import RecordReader, TorchArchive
    from accelkit.merge.source import CheckpointSource, Segment

ACCELERATE = re.compile(r"^pytorch_model_fsdp_(\d+)_rank(\d+)\.bin$")
VERL = re.compile(r"^model_world_size_(\d+)_rank_(\d+)\.pt$")
_ONE_SAVE = "copy every rank's file of one save into the folder, and nothing else"


@dataclass(frozen=True)
class PerRankFiles:
    """The rank files of one save: rank -> file, the world size the names give (verl's; Accelerate's names do not),
    the layout's name and why it was recognised."""

    files: dict[int, Path]
    world_size: int | None
    layout: str
    why: str


def is_rank_file(path: Path) -> bool:
    return bool(ACCELERATE.match(path.name) or VERL.match(path.name))


def find_rank_files(folder: Path, model_index: int | None) -> PerRankFiles | None:
    """The per-rank files in `folder` (None when it holds none), refused when they cannot be one save's: ranks
    missing from the names, names of several world sizes."""
    accelerate: dict[int, dict[int, Path]] = {}
    verl: dict[int, dict[int, Path]] = {}
    for path in folder.iterdir():
        if (m := ACCELERATE.match(path.name)) and path.is_file():
            accelerate.setdefault(int(m.group(1)), {})[int(m.group(2))] = path
        elif (m := VERL.match(path.name)) and path.is_file():
            verl.setdefault(int(m.group(1)), {})[int(m.group(2))] = path
    if accelerate:
        index = model_index if model_index is not None else 0
        if index not in accelerate:
            raise AccelkitError(f"no pytorch_model_fsdp_{index}_rank*.bin in {folder}",
                                hint=f"--model-index takes one of {sorted(accelerate)}")
        files = accelerate[index]
        _gaps(files, max(files) + 1, f"pytorch_model_fsdp_{index}_rank{{}}.bin", folder)
        extra = f"; {len(accelerate)} models saved, pick another with --model-index" if len(accelerate) > 1 else ""
        return PerRankFiles(files, None, "Accelerate FSDP2 per-rank files (save_fsdp_model, use_dcp=False)",
                         f"{folder.name}/ holds pytorch_model_fsdp_{index}_rank*.bin: Accelerate's per-rank FSDP2 "
                         f"files{extra}")
    if not verl:
        return None
    if model_index is not None:
        raise AccelkitError("--model-index applies only to Accelerate's FSDP models",
                            hint=f"{folder} holds model_world_size_N_rank_R.pt files: merge without it")
    if len(verl) > 1:
        sizes = ", ".join(f"{n} ({len(verl[n])} file{'s' if len(verl[n]) > 1 else ''})" for n in sorted(verl))
        raise AccelkitError(f"{folder} holds model_world_size_N_rank_R.pt files of different world sizes: {sizes}",
                            hint=_ONE_SAVE)
    world, files = next(iter(verl.items()))
    beyond = sorted(r for r in files if r >= world)
    if beyond:
        raise AccelkitError(f"{files[beyond[0]].name} names rank {beyond[0]} of a world of {world} ranks",
                            hint=_ONE_SAVE)
    _gaps(files, world, f"model_world_size_{world}_rank_{{}}.pt", folder)
    return PerRankFiles(files, world, "per-rank FSDP2 state dicts (model_world_size_N_rank_R.pt)",
                     f"{folder.name}/ holds model_world_size_{world}_rank_*.pt: per-rank FSDP2 state dicts")


def _gaps(files: dict[int, Path], world: int, pattern: str, folder: Path) -> None:
    missing = [r for r in range(world) if r not in files]
    if missing:
        names = ", ".join(pattern.format(r) for r in missing[:3]) + (" and more" if len(missing) > 3 else "")
        raise AccelkitError(f"{folder}: the file of rank {', '.join(map(str, missing[:3]))} is missing ({names}): "
                            f"a run of at least {world} ranks, {len(files)} rank files found",
                            hint="copy every rank's file of the save into the folder")


def _dtensor_globals() -> list:
    """DTensor's classes as its pickles name them (torch 2.13): with these, and nothing else, allowlisted, torch's
    weights_only unpickler rebuilds a DTensor's local tensor, placements and device mesh."""
    import torch.distributed._mesh_layout as mesh_layout
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta

    return [DTensor, DTensorSpec, TensorMeta, ShardOrderEntry, DeviceMesh, mesh_layout._MeshLayout,
            mesh_layout._FlatLayout, Shard, Replicate]


@contextlib.contextmanager
def _quiet_mesh():
    """A device mesh unpickled with no process group logs a warning about torch.compile: not this program's concern."""
    log = logging.getLogger("torch.distributed.device_mesh")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def open_per_rank(folder: Path, model_index: int | None, reader: RecordReader) -> CheckpointSource:
    """The reader: every rank's file opened and checked against the others, every tensor as segments."""
    from accelkit.merge.records import TorchArchive
    from accelkit.merge.source import CheckpointSource

    found = find_rank_files(folder, model_index)
    if found is None:
        raise AccelkitError(f"{folder} holds no per-rank model files", hint="point at the folder of the rank files")
    source = CheckpointSource(format_name=found.layout, root=folder, reader=reader,
                              files=[found.files[r] for r in sorted(found.files)])
    safe = _dtensor_globals()
    with _quiet_mesh():
        archives = {r: TorchArchive.open(path, safe) for r, path in sorted(found.files.items())}
    _Assembly(found, archives, source).build()
    return source


class _Assembly:
    """The checks across the rank files, and each tensor's segments."""

    def __init__(self, found: PerRankFiles, archives: dict[int, TorchArchive], source: CheckpointSource) -> None:
        self.found, self.archives, self.source = found, archives, source
        self.dicts = {r: _state_dict(a) for r, a in archives.items()}
        self.ranks = sorted(archives)

    def build(self) -> None:
        from torch.distributed.tensor import DTensor

        first = self.dicts[self.ranks[0]]
        for rank in self.ranks[1:]:
            odd = sorted(set(first).symmetric_difference(self.dicts[rank]))
            if odd:
                raise AccelkitError(f"{self.found.files[rank].name} and {self.found.files[self.ranks[0]].name} hold "
                                    f"different tensors ({odd[0]!r} is in one and not the other)", hint=_ONE_SAVE)
        world = self.found.world_size
        meshes = 0
        seen: dict[tuple, str] = {}
        for name, value in first.items():
            kinds = {isinstance(self.dicts[r][name], DTensor) for r in self.ranks}
            if len(kinds) > 1:
                raise AccelkitError(f"{name!r} is a DTensor in some rank files and a plain tensor in others",
                                    hint=_ONE_SAVE)
            if isinstance(value, DTensor):
                world = self._check_mesh(name, world)
                meshes += 1
            else:
                self._check_plain(name)
            key = self._alias_key(name)
            if key is not None and key in seen:
                self.source.aliases[name] = seen[key]
                continue
            if key is not None:
                seen[key] = name
            self.source.tensors.append(self._tensor(name))
        if world is None:  # no DTensor at all: the names gave no world size either
            world = len(self.ranks)
        missing = [r for r in range(world) if r not in self.archives]
        if missing:
            raise AccelkitError(f"{self.source.root}: the file of rank {', '.join(map(str, missing[:3]))} is "
                                f"missing: the device mesh has {world} ranks, {len(self.ranks)} rank files were found",
                                hint="copy every rank's file of the save into the folder")
        if len(self.ranks) != world:
            raise AccelkitError(f"{self.source.root}: {len(self.ranks)} rank files for a device mesh of {world} ranks",
                                hint=_ONE_SAVE)
        self.source.world_size = world
        self.source.checks.append(f"{len(self.ranks)} rank files: {meshes} DTensors with one mesh, placements, global "
                                  "shape and dtype on every rank, each shard the shape its mesh coordinate gives")
        self.source.checks.append("every rank file: the CRC-32 of every record read is checked")

    def _check_mesh(self, name: str, world: int | None) -> int:
        """One mesh, placements, shape and dtype on every rank; each rank at its own coordinate with its shard."""
        from torch.distributed.tensor import Replicate, Shard

        head = self.dicts[self.ranks[0]][name]
        mesh_shape = tuple(head.device_mesh.shape)
        size = math.prod(mesh_shape)
        if world is not None and size != world:
            raise AccelkitError(f"{name!r} in {self.found.files[self.ranks[0]].name} is sharded over a mesh of {size} "
                                f"ranks, but the files are of a world of {world}", hint=_ONE_SAVE)
        sharded_dims = [p.dim for p in head.placements if type(p) is Shard]
        for p in head.placements:
            if type(p) not in (Shard, Replicate):
                raise AccelkitError(f"{name!r} has the placement {p}, which merge-ckpt cannot prove how to put "
                                    "together (it merges Shard(dim) and Replicate placements)",
                                    hint="save a full state dict instead (get_model_state_dict with "
                                         "full_state_dict=True)")
        if len(set(sharded_dims)) != len(sharded_dims):
            raise AccelkitError(f"{name!r} is sharded twice along one dimension ({head.placements})",
                                hint="save a full state dict instead (get_model_state_dict with full_state_dict=True)")
        coordinates = {}
        for rank in self.ranks:
            value = self.dicts[rank][name]
            file = self.found.files[rank].name
            if (tuple(value.device_mesh.shape), tuple(value.placements), tuple(value.shape), value.dtype) != (
                    mesh_shape, tuple(head.placements), tuple(head.shape), head.dtype):
                raise AccelkitError(
                    f"{file}: {name!r} is {tuple(value.shape)} {value.dtype} {tuple(value.placements)} on a mesh "
                    f"{tuple(value.device_mesh.shape)}, but {tuple(head.shape)} {head.dtype} "
                    f"{tuple(head.placements)} on {mesh_shape} in {self.found.files[self.ranks[0]].name}",
                    hint=_ONE_SAVE)
            coordinate = tuple(value.device_mesh.get_coordinate() or ())
            if coordinate != _coordinate(rank, mesh_shape) or coordinate in coordinates:
                raise AccelkitError(f"{file} holds the shard of mesh coordinate {coordinate}, not rank {rank}'s "
                                    f"{_coordinate(rank, mesh_shape)}", hint=_ONE_SAVE)
            coordinates[coordinate] = rank
            want = _local_shape(tuple(head.shape), head.placements, mesh_shape, coordinate)
            if tuple(value.to_local().shape) != want:
                raise AccelkitError(f"{file}: the shard of {name!r} is {tuple(value.to_local().shape)}, but rank "
                                    f"{rank} of {tuple(head.shape)} sharded {tuple(head.placements)} holds {want}",
                                    hint=_ONE_SAVE)
        return size

    def _check_plain(self, name: str) -> None:
        """A plain tensor (a buffer FSDP2 leaves whole): one shape and dtype in every rank file; rank 0's is merged."""
        head = self.dicts[self.ranks[0]][name]
        for rank in self.ranks[1:]:
            value = self.dicts[rank][name]
            if (tuple(value.shape), value.dtype) != (tuple(head.shape), head.dtype):
                raise AccelkitError(f"{self.found.files[rank].name}: {name!r} is {tuple(value.shape)} {value.dtype}, "
                                    f"but {tuple(head.shape)} {head.dtype} in {self.found.files[self.ranks[0]].name}",
                                    hint=_ONE_SAVE)

    def _alias_key(self, name: str) -> tuple | None:
        """What makes `name` the same tensor as another (tied weights): the same local storage, offset, shape and
        strides, and the same placements, in every rank file."""
        from accelkit.merge.torch_files import storage_identity

        parts = []
        for rank in self.ranks:
            value = self.dicts[rank][name]
            local = _local(value)
            if not local.numel():
                return None
            parts.append((storage_identity(local), local.storage_offset(), tuple(local.shape), tuple(local.stride()),
                          local.dtype, tuple(getattr(value, "placements", ())), tuple(value.shape)))
        return tuple(parts)

    def _tensor(self, name: str):
        from torch.distributed.tensor import DTensor, Shard

        from accelkit.merge.torch_files import tensor_segments, torch_tensor

        head = self.dicts[self.ranks[0]][name]
        if not isinstance(head, DTensor):  # a buffer FSDP2 leaves whole on every rank: rank 0's
            return torch_tensor(name, head, tensor_segments(self.archives[self.ranks[0]], self.source.reader, head))
        mesh_shape = tuple(head.device_mesh.shape)
        shards = [(i, p.dim) for i, p in enumerate(head.placements) if type(p) is Shard]
        # The ranks whose shards make the tensor once: coordinate 0 on every mesh dim that replicates.
        holders = [r for r in self.ranks
                   if all(c == 0 for i, c in enumerate(_coordinate(r, mesh_shape)) if i not in dict(shards))]
        segments: list[Segment] = []
        if not shards:
            segments = tensor_segments(self.archives[holders[0]], self.source.reader, _local(head))
        elif len(shards) == 1 and math.prod(head.shape[:shards[0][1]]) == 1:
            # rows (or a leading dim) split in mesh order: the shards' bytes, back to back
            axis = shards[0][0]
            for rank in sorted(holders, key=lambda r: _coordinate(r, mesh_shape)[axis]):
                segments += tensor_segments(self.archives[rank], self.source.reader, _local(self.dicts[rank][name]))
        else:
            segments = [self._assembled(name, holders, mesh_shape)]
        return torch_tensor(name, head, segments)

    def _assembled(self, name: str, holders: list[int], mesh_shape: tuple[int, ...]):
        """A tensor no run of byte ranges covers (sharded along a later dim, or along two), put together by torch."""
        import torch

        from accelkit.merge.torch_files import materialise, materialised

        head = self.dicts[self.ranks[0]][name]

        def build() -> torch.Tensor:
            full = torch.empty(tuple(head.shape), dtype=head.dtype)
            for rank in holders:
                value = self.dicts[rank][name]
                window = _window(tuple(head.shape), head.placements, mesh_shape, _coordinate(rank, mesh_shape))
                full[window] = materialise(self.archives[rank], self.source.reader, _local(value))
            return full

        return materialised(math.prod(head.shape) * head.element_size(), build)


def _state_dict(archive: TorchArchive) -> dict[str, Any]:
    import torch

    obj = archive.obj
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise AccelkitError(f"{archive.path} is not a state dict of tensors",
                            hint="each rank file must hold that rank's model.state_dict(), as torch.save wrote it")
    return obj


def _local(value: torch.Tensor) -> torch.Tensor:
    return value.to_local() if hasattr(value, "to_local") else value


def _coordinate(rank: int, mesh_shape: tuple[int, ...]) -> tuple[int, ...]:
    """A rank's place in a mesh laid out in rank order (init_device_mesh's, and FSDP2's default)."""
    coordinate = []
    for size in reversed(mesh_shape):
        coordinate.append(rank % size)
        rank //= size
    return tuple(reversed(coordinate))


def _chunk(size: int, parts: int, index: int) -> tuple[int, int]:
    """torch's chunking of `size` into `parts`: (start, length) of part `index` (ceil-sized, the last ones shorter)."""
    step = -(-size // parts) if parts else 0
    start = min(size, step * index)
    return start, min(size, start + step) - start


def _window(shape: tuple[int, ...], placements: Any, mesh_shape: tuple[int, ...],
            coordinate: tuple[int, ...]) -> tuple[slice, ...]:
    """The part of the full tensor the shard at `coordinate` holds."""
    from torch.distributed.tensor import Shard

    window = [slice(0, n) for n in shape]
    for axis, placement in enumerate(placements):
        if type(placement) is Shard:
            start, length = _chunk(shape[placement.dim], mesh_shape[axis], coordinate[axis])
            window[placement.dim] = slice(start, start + length)
    return tuple(window)


def _local_shape(shape: tuple[int, ...], placements: Any, mesh_shape: tuple[int, ...],
                 coordinate: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in _window(shape, placements, mesh_shape, coordinate))
