"""Reader for DeepSpeed ZeRO-1/2/3 checkpoints (`engine.save_checkpoint`).

DcpLayout: `<dir>/latest` names a tag; `<dir>/<tag>/` holds the model states (`mp_rank_00_model_states.pt` for
ZeRO-1/2, `zero_pp_rank_{r}_mp_rank_00_model_states.pt` per rank for ZeRO-3: parameter names and shapes, buffers,
frozen parameters, shared (tied) parameters) and one `*_optim_states.pt` per rank holding that rank's slice of the
flat fp32 master weights:

- ZeRO-1/2: per parameter group, the flat vector of all parameters (each followed by its alignment padding) is cut
  into `world_size` consecutive partitions; rank r holds partition r. Partitions are usually equal, but not always
  (a small group of 1602 values splits 802/800 on 2 ranks), so each rank's start is the sum of the sizes before it.
- ZeRO-3: every parameter is cut on its own into `world_size` slices of ceil(numel / world_size) elements (the last
  padded); rank r's flat group concatenates its slice of every parameter.

A parameter is rebuilt by copying the ranges it covers out of each rank's memory-mapped partition, so memory holds
one parameter at a time. The output is the fp32 master weights (what the optimizer trains), plus buffers and frozen
parameters as saved.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import torch

from accelkit.errors import AccelkitError
from accelkit.merge import deepspeed_layout as layout
from accelkit.merge.dtypes import name_of
from accelkit.merge.source import CheckpointSource, Segment, Tensor
from accelkit.merge.torch_files import materialise, open_archive, peek_flat, tensor_segments

_OPTIM, _ZERO3_MODEL, ZERO12_MODEL_FILE = layout.OPTIM, layout.ZERO3_MODEL, layout.ZERO12_MODEL_FILE
resolve_tag_dir, _ranked = layout.resolve_tag_dir, layout.ranked
_enum_value, _world_size = layout.enum_value, layout.world_size


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


class DeepSpeedSource(CheckpointSource):
    def __init__(self, path: Path, tag: str | None = None) -> None:
        tag_dir, how = resolve_tag_dir(path, tag)
        super().__init__(format_name="DeepSpeed ZeRO", root=tag_dir)
        self.tag = tag_dir.name
        self.notes.append(f"DeepSpeed checkpoint folder {tag_dir} ({how})")
        optim_paths = _ranked(tag_dir, _OPTIM, "*_optim_states.pt")
        self._optim = [open_archive(p) for p in optim_paths]
        head = self.optim_state(0)
        if head.get("zero_stage") is None or head.get("partition_count") is None:
            raise AccelkitError(f"{optim_paths[0]} has no zero_stage/partition_count: not a ZeRO optimizer state",
                                hint="merge-ckpt reads checkpoints written by engine.save_checkpoint with ZeRO 1-3")
        self.stage = int(_enum_value(head.get("zero_stage")))
        world = _world_size(head)
        _refuse_count(tag_dir, optim_paths, world, "optimizer")
        self.world_size = world
        self.format_name = f"DeepSpeed ZeRO-{self.stage}"
        if self.stage == 3:
            model_paths = _ranked(tag_dir, _ZERO3_MODEL, "zero_pp_rank_*_model_states.pt")
        else:
            model_paths = [tag_dir / ZERO12_MODEL_FILE]
        if self.stage == 3:
            _refuse_count(tag_dir, model_paths, world, "model-state")
        self.model_files = model_paths
        self._models = [open_archive(p) for p in model_paths]
        for rank, archive in enumerate(self._optim[1:], start=1):
            other = self.optim_state(rank)
            other_world = _world_size(other)
            if other_world != world or int(_enum_value(other.get("zero_stage"))) != self.stage:
                raise AccelkitError(f"{archive.path.name} comes from a different run (world size {other_world}, "
                                    f"ZeRO-{int(_enum_value(other.get('zero_stage')))}) than {optim_paths[0].name} "
                                    f"(world size {world}, ZeRO-{self.stage}): shards from different world sizes "
                                    "or runs are mixed",
                                    hint="copy the complete checkpoint of one run into a clean folder")
        self.files = [*model_paths, *optim_paths]
        self._plan()
        layout.check_zero_files(self._rank_files(), self.checks, self.step_counters)

    # -- file access -------------------------------------------------------------------------------------------
    def optim_state(self, rank: int) -> dict[str, Any]:
        sd = self._optim[rank].obj
        if not isinstance(sd, dict) or "optimizer_state_dict" not in sd:
            raise AccelkitError(f"{self._optim[rank].path} is not a DeepSpeed ZeRO optimizer state file",
                                hint="point at a checkpoint written by engine.save_checkpoint")
        return sd["optimizer_state_dict"]

    def flat_groups(self, rank: int) -> list[torch.Tensor]:
        key = "fp32_flat_groups" if self.stage == 3 else "single_partition_of_fp32_groups"
        groups = self.optim_state(rank).get(key)
        if not isinstance(groups, list) or not all(isinstance(g, torch.Tensor) and g.dim() == 1 for g in groups):
            raise AccelkitError(f"{self._optim[rank].path} holds no flat fp32 partitions ({key})",
                                hint="point at a checkpoint written by engine.save_checkpoint")
        return groups

    def model_state(self, rank: int = 0) -> dict[str, Any]:
        sd = self._models[rank].obj
        if not isinstance(sd, dict) or "param_shapes" not in sd or "buffer_names" not in sd:
            raise AccelkitError(f"{self._models[rank].path} is not a DeepSpeed model state file",
                                hint="point at a checkpoint written by engine.save_checkpoint")
        return sd

    def _rank_files(self) -> layout.ZeroRankFiles:
        """This checkpoint as the consistency checks read it (torch tensors, read through their CRC-32)."""
        world = self.world_size or 1

        def scalar(rank: int, value: Any) -> Any:
            if isinstance(value, torch.Tensor):
                return materialise(self._optim[rank], self.reader, value).item()
            return value

        def sample(rank: int, flat: torch.Tensor, index: int, weights: torch.Tensor,
                   weights_index: int) -> tuple[bool, str, str]:
            master = peek_flat(self._optim[rank], self.reader, flat, index)
            copy = peek_flat(self._models[0], self.reader, weights, weights_index)
            same = torch.equal(master.to(copy.dtype).reshape(1).view(torch.uint8), copy.reshape(1).view(torch.uint8))
            return bool(same), repr(master.item()), repr(copy.item())

        def samplable(weights: Any, numel: int) -> bool:
            return (isinstance(weights, torch.Tensor) and weights.is_floating_point() and weights.numel() == numel
                    and weights.is_contiguous())

        return layout.ZeroRankFiles(
            tag=self.tag, stage=self.stage, world=world, model_files=list(self.model_files),
            model_states=[self.model_state(r) for r in range(len(self.model_files))],
            optim_files=[a.path for a in self._optim], optim_states=[self.optim_state(r) for r in range(world)],
            where=self.where, partitions=self.partitions,
            flats=[self.flat_groups(r) for r in range(world)] if self.stage < 3 else [],
            scalar=scalar, sample=sample, samplable=samplable)

    # -- planning: where every tensor comes from ---------------------------------------------------------------
    def _plan(self) -> None:
        ms = self.model_state(0)
        self.where: dict[str, tuple] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        self.group_sizes = [[t.numel() for t in self.flat_groups(r)] for r in range(self.world_size or 1)]
        group_sizes = self.group_sizes
        if any(len(sizes) != len(group_sizes[0]) for sizes in group_sizes) or (
                self.stage == 3 and any(sizes != group_sizes[0] for sizes in group_sizes)):
            odd = next(r for r, sizes in enumerate(group_sizes) if sizes != group_sizes[0])
            raise AccelkitError(f"{self._optim[odd].path.name} holds partitions of other sizes than "
                                f"{self._optim[0].path.name}: they come from different runs",
                                hint="copy the complete checkpoint of one run")
        fp32 = self.flat_groups(0)[0].dtype if group_sizes[0] else torch.float32
        if self.stage == 3:
            self._plan_zero3(ms, group_sizes[0], shapes)
        else:
            self._plan_zero12(ms, group_sizes, shapes)
        plan = layout.plan_tensors(
            ms, self.stage, self.where, shapes, fp32,
            frozen_dtype=lambda name: ms["frozen_param_fragments"][name].dtype,
            shape_dtype=lambda tensor: (tuple(tensor.shape), tensor.dtype),
            is_tensor=lambda value: isinstance(value, torch.Tensor))
        self.where, self.aliases = plan.where, plan.aliases
        if plan.from_module:
            self.notes.append(layout.module_only_note(plan.from_module))
        self.tensors = [Tensor(k, name_of(plan.dtypes[k]), tuple(plan.shapes[k]),
                               self._segments(k, math.prod(plan.shapes[k])), plan.dtypes[k].itemsize)
                        for k in plan.order]

    def _plan_zero12(self, ms: dict[str, Any], rank_sizes: list[list[int]], shapes: dict) -> None:
        self.partitions = layout.zero12_fragment_ranges(rank_sizes)
        with self._mismatch_refused():
            where, planned = layout.plan_zero12(ms["param_shapes"], rank_sizes,
                                                self.optim_state(0).get("param_alignment_paddings"))
        self.where.update(where)
        shapes.update(planned)

    def _plan_zero3(self, ms: dict[str, Any], part_sizes: list[int], shapes: dict) -> None:
        self.partitions = []  # ZeRO-3 partitions every parameter itself
        with self._mismatch_refused():
            where, planned = layout.plan_zero3(ms["param_shapes"], part_sizes, self.world_size or 1)
        self.where.update(where)
        shapes.update(planned)

    @contextlib.contextmanager
    def _mismatch_refused(self):
        try:
            yield
        except layout.LayoutMismatch as exc:
            raise AccelkitError(f"{self.root}: {exc}",
                                hint="the model and optimizer files come from different runs") from None

    # -- reading ------------------------------------------------------------------------------------------------
    def _rank_range(self, rank: int, start: int, length: int, group: int | None) -> list[Segment]:
        """Elements [start, start + length) of rank's flat group `group` (or of all its groups back to back)."""
        groups = self.flat_groups(rank)
        chosen = [(g, groups[g]) for g in range(len(groups))] if group is None else [(group, groups[group])]
        out, base = [], 0
        for _, flat in chosen:
            n = flat.numel()
            lo, hi = max(start, base), min(start + length, base + n)
            if lo < hi:
                out += tensor_segments(self._optim[rank], self.reader, flat, lo - base, hi - base)
            base += n
        return out

    def _segments(self, name: str, numel: int) -> list[Segment]:
        where = self.where[name]
        kind = where[0]
        if kind == "module":
            return tensor_segments(self._models[0], self.reader, self.model_state(0)["module"][name])
        if kind == "frozen":
            if self.stage < 3:
                return tensor_segments(self._models[0], self.reader,
                                       self.model_state(0)["frozen_param_fragments"][name])
            out, left = [], numel
            for rank in range(len(self._models)):  # ZeRO-3: each rank holds a slice, the last one padded
                fragment = self.model_state(rank)["frozen_param_fragments"][name]
                take = min(left, fragment.numel())
                out += tensor_segments(self._models[rank], self.reader, fragment, 0, take)
                left -= take
            return out
        out = []
        for rank, start, length, group in layout.parameter_ranges(where, self.partitions, self.world_size or 1):
            out += self._rank_range(rank, start, length, group)
        return out
