"""What both DeepSpeed readers share, without torch: where the rank files of a ZeRO checkpoint are, and the small
rules the consistency checks apply (deepspeed_checks on the torch path, light_deepspeed on the torch-free one)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError

OPTIM = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_optim_states\.pt$")
ZERO3_MODEL = re.compile(r"^zero_pp_rank_(\d+)_mp_rank_(\d+)_model_states\.pt$")
ZERO12_MODEL_FILE = "mp_rank_00_model_states.pt"
ONE_SAVE = "copy the complete checkpoint of one save (every rank's files from the same tag folder) into a clean folder"
DEFAULT_TAG = re.compile(r"^global_step(\d+)$")


def is_deepspeed_tag_dir(path: Path) -> bool:
    return path.is_dir() and any(OPTIM.match(p.name) for p in path.iterdir())


def resolve_tag_dir(path: Path, tag: str | None) -> tuple[Path, str]:
    """The folder holding the rank files, and how it was chosen."""
    if tag is not None:
        tag_dir = path / tag
        if not tag_dir.is_dir():
            raise AccelkitError(f"no tag folder {tag!r} in {path}", hint=f"tags found: {tags(path) or 'none'}")
        return tag_dir, f"tag {tag!r} (from --tag)"
    latest = path / "latest"
    if latest.is_file():
        name = latest.read_text().strip()
        if not (path / name).is_dir():
            raise AccelkitError(f"{latest} names tag {name!r} but {path / name} does not exist",
                                hint=f"pass --tag with one of: {tags(path) or 'none'}")
        return path / name, f"tag {name!r} (from {latest.name})"
    return path, "tag folder given directly"


def tags(path: Path) -> str:
    return ", ".join(sorted(p.name for p in path.iterdir() if is_deepspeed_tag_dir(p)))


def ranked(folder: Path, pattern: re.Pattern[str], what: str) -> list[Path]:
    """Every rank's file matching `pattern`, in rank order; refused when a rank is missing or mp_rank > 0."""
    found: dict[int, Path] = {}
    for p in folder.iterdir():
        m = pattern.match(p.name)
        if m:
            if int(m.group(2)) != 0:
                raise AccelkitError(f"{p.name}: tensor-parallel (mp_rank > 0) DeepSpeed checkpoints are not supported",
                                    hint="merge with DeepSpeed's universal checkpoint tools (ds_to_universal.py)")
            found[int(m.group(1))] = p
    if not found:
        raise AccelkitError(f"no {what} files in {folder}", hint="point at the folder that `latest` names")
    missing = [r for r in range(max(found) + 1) if r not in found]
    if missing:
        raise AccelkitError(f"{what} file of rank {missing[0]} is missing in {folder} "
                            f"(found ranks {sorted(found)})", hint="copy every rank's files into the tag folder")
    return [found[r] for r in sorted(found)]


def enum_value(value: Any) -> Any:
    """ZeroStageEnum arrives as an inert stand-in (see torch_files, light_pickle) or, in old files, as a plain int."""
    return getattr(value, "value", value)


def world_size(optim_state: dict[str, Any]) -> int:
    """The world size a rank's optimizer state was written by (partition_count: one int, or one per group)."""
    count = optim_state.get("partition_count")
    return max(count) if isinstance(count, list) else int(count)


def odd_one(values: list[Any]) -> int | None:
    """The index of a value that differs from the most common one (the first differing when there is a tie)."""
    common = Counter(values).most_common(1)[0][0]
    if values.count(common) * 2 == len(values):  # a tie: trust the first file
        common = values[0]
    return next((i for i, v in enumerate(values) if v != common), None)


def steps_text(steps: tuple) -> str:
    distinct = sorted({int(s) if isinstance(s, float) and s.is_integer() else s for s in steps}, key=str)
    return ", ".join(str(s) for s in distinct)


def fragment(value: Any) -> tuple[int, int] | None:
    """(numel, start) of a DeepSpeed fragment_address (an inert stand-in, a tuple or an object)."""
    state = getattr(value, "state", None)
    if isinstance(state, dict) and "numel" in state:
        return int(state["numel"]), int(state["start"])
    if hasattr(value, "numel") and hasattr(value, "start"):
        return int(value.numel), int(value.start)
    if isinstance(value, tuple) and len(value) == 2:
        return int(value[0]), int(value[1])
    return None


def zero12_fragment_ranges(rank_sizes: list[list[int]]) -> list[list[tuple[int, int]]]:
    """[group][rank] -> (start, size) of each rank's partition in each group's flat vector."""
    out = []
    for g in range(len(rank_sizes[0])):
        starts = [sum(sizes[g] for sizes in rank_sizes[:r]) for r in range(len(rank_sizes))]
        out.append([(start, sizes[g]) for start, sizes in zip(starts, rank_sizes, strict=True)])
    return out


def expected_fragments(where: dict[str, tuple], partitions: list[list[tuple[int, int]]], group: int,
                       rank: int) -> dict[str, tuple[int, int]]:
    """The (numel, start) of each parameter fragment rank `rank` holds in group `group` (ZeRO-1/2)."""
    start, size = partitions[group][rank]
    out = {}
    for name, place in where.items():
        if place[0] == "flat12" and place[1] == group:
            _, _, offset, numel = place
            lo, hi = max(offset, start), min(offset + numel, start + size)
            if lo < hi:
                out[name] = (hi - lo, lo - start)
    return out


def parameter_ranges(where: tuple, partitions: list[list[tuple[int, int]]],
                     world_size: int) -> Iterator[tuple[int, int, int, int | None]]:
    """(rank, first element in the rank's flat storage, element count, flat group or None for all groups back to
    back) of a trained parameter's elements, in order.

    ZeRO-1/2 ("flat12"): the parameter is one range of its group's flat vector, and rank r holds
    [start_r, start_r + size_r) of it. ZeRO-3: rank r holds elements [r*per_rank, (r+1)*per_rank) of the (padded)
    parameter, at `offset` in its own flat storage."""
    if where[0] == "flat12":
        _, group, offset, numel = where
        for rank, (start, size) in enumerate(partitions[group]):
            lo, hi = max(offset, start), min(offset + numel, start + size)
            if lo < hi:
                yield rank, lo - start, hi - lo, group
        return
    _, offset, per_rank, numel = where
    for rank in range(world_size):
        take = min(per_rank, numel - rank * per_rank)
        if take > 0:
            yield rank, offset, take, None


class LayoutMismatch(Exception):
    """The model states and the optimizer shards disagree on the layout: files of different runs."""


def plan_zero12(param_shapes: list[dict[str, Any]], rank_sizes: list[list[int]],
                paddings: list[list[int]] | None) -> tuple[dict[str, tuple], dict[str, tuple[int, ...]]]:
    """ZeRO-1/2: where each trained parameter lies in its group's flat vector, ("flat12", group, offset, numel) by
    name, and its shape; the partitions are `zero12_fragment_ranges(rank_sizes)`."""
    if len(param_shapes) != len(rank_sizes[0]):
        raise LayoutMismatch(f"model states list {len(param_shapes)} parameter groups, optimizer shards "
                             f"{len(rank_sizes[0])}")
    partitions = zero12_fragment_ranges(rank_sizes)
    where: dict[str, tuple] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    for g, group in enumerate(param_shapes):
        offset = 0
        for i, (name, shape) in enumerate(group.items()):
            numel = math.prod(shape)
            shapes[name] = tuple(shape)
            where[name] = ("flat12", g, offset, numel)
            offset += numel + (paddings[g][i] if paddings else 0)
        held = sum(size for _, size in partitions[g])
        if offset > held:  # the exact layout is checked against every rank's param_slice_mappings
            raise LayoutMismatch(f"parameter group {g} of the model states needs {offset} values but the optimizer "
                                 f"shards hold {held}")
    return where, shapes


def plan_zero3(param_shapes: list[dict[str, Any]], part_sizes: list[int],
               world_size: int) -> tuple[dict[str, tuple], dict[str, tuple[int, ...]]]:
    """ZeRO-3: each parameter's ("flat3", offset, per_rank, numel) in every rank's flat storage, and its shape."""
    where: dict[str, tuple] = {}
    shapes: dict[str, tuple[int, ...]] = {}
    offset = 0
    for group in param_shapes:
        for name, shape in group.items():
            numel = math.prod(shape)
            per_rank = math.ceil(numel / world_size)
            shapes[name] = tuple(shape)
            where[name] = ("flat3", offset, per_rank, numel)
            offset += per_rank
    if offset != sum(part_sizes):
        raise LayoutMismatch(f"parameters need {offset} values per rank but the shards hold {sum(part_sizes)}")
    return where, shapes


@dataclass
class TensorPlan:
    """Every tensor a ZeRO checkpoint merges to: where it is, its shape and dtype, in the module's order."""

    where: dict[str, tuple]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, Any]
    aliases: dict[str, str]  # a tied name -> the name it shares its tensor with
    order: list[str]
    from_module: list[str] = field(default_factory=list)  # ZeRO-1/2 frozen tensors found only in the module


def plan_tensors(ms: dict[str, Any], stage: int, trained: dict[str, tuple], shapes: dict[str, tuple[int, ...]],
                 fp32: Any, *, frozen_dtype: Callable[[str], Any], shape_dtype: Callable[[Any], tuple[tuple, Any]],
                 is_tensor: Callable[[Any], bool]) -> TensorPlan:
    """Add the frozen parameters, buffers and (ZeRO-1/2) module-only tensors to the trained ones (`trained`: where,
    `shapes`: their shapes, stored as `fp32`). The callables read a tensor of the reader's kind (torch or light)."""
    module: dict[str, Any] = ms.get("module") or {}
    where, shapes = dict(trained), dict(shapes)
    dtypes: dict[str, Any] = dict.fromkeys(shapes, fp32)
    for name, shape in (ms.get("frozen_param_shapes") or {}).items():
        shapes[name], where[name], dtypes[name] = tuple(shape), ("frozen",), frozen_dtype(name)
    for name in ms.get("buffer_names") or []:
        if name in module:
            (shapes[name], dtypes[name]), where[name] = shape_dtype(module[name]), ("module",)
    aliases = {k: v for k, v in (ms.get("shared_params") or {}).items() if v in shapes and k not in shapes}
    extra: list[str] = []
    if stage < 3:
        # ZeRO-1 does not list frozen parameters separately; the module state dict has them in full.
        extra = [k for k, v in module.items() if k not in shapes and k not in aliases and is_tensor(v)]
        for name in extra:
            (shapes[name], dtypes[name]), where[name] = shape_dtype(module[name]), ("module",)
    order = [k for k in module if k in shapes] + [k for k in shapes if k not in module]
    return TensorPlan(where, shapes, dtypes, aliases, order, extra)


def module_only_note(names: list[str]) -> str:
    return f"{len(names)} tensors outside the optimizer (frozen) taken from the module state dict (e.g. {names[0]})"
