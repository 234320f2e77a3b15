"""The DeepSpeed ZeRO layout and consistency checks, without torch.

Where the rank files of a ZeRO checkpoint are, how its partitions lay out the parameters, and: do all the files of a
DeepSpeed ZeRO checkpoint come from one save? Every signal DeepSpeed writes is checked, once, with the user-facing
message: the reader (deepspeed) hands its files over as `ZeroRankFiles`, with small callables that read a tensor.

- `global_steps` in the model states (one file for ZeRO-1/2, one per rank for ZeRO-3) must agree with each other and
  with the tag folder when it has DeepSpeed's default name `global_step<N>`.
- The optimizer's own step counter (`step` of torch's Adam/AdamW and friends) in every rank's optimizer state: all
  ranks step together, so a rank file from another step disagrees.
- ZeRO-1/2: every rank lists the parameter fragments its partition holds (`param_slice_mappings`: numel and start
  of each); they must be exactly what the model's `param_shapes` and the partition sizes give.
- ZeRO-1/2: the model states hold the full module weights, which DeepSpeed copies from the fp32 partitions after
  every step; a few elements of every parameter are compared in each rank's partition (cast to the module's
  dtype). A rank file from another run or step disagrees even when its shapes and counters look right.

What cannot be told: a ZeRO-3 rank file from another run saved at the same step (ZeRO-3 keeps no second copy of
the weights). A manifest written at save time (accelkit's templates write one) catches that too.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.merge.counters import Counted, FolderCounters


@dataclass
class ZeroRankFiles:
    """What the checks read from a ZeRO checkpoint, whichever reader opened it."""

    tag: str  # the tag folder's name
    stage: int
    world: int
    model_files: list[Path]
    model_states: list[dict[str, Any]]
    optim_files: list[Path]
    optim_states: list[dict[str, Any]]
    where: dict[str, tuple]  # deepspeed_layout's place of every tensor
    partitions: list[list[tuple[int, int]]]  # ZeRO-1/2: [group][rank] -> (start, size)
    flats: list[list[Any]]  # [rank][group] -> the rank's flat fp32 partition
    scalar: Callable[[int, Any], Any]  # (rank, a step value) -> the number (a one-element tensor read)
    # (rank, flat, element, module weights, element) -> (whether equal once cast, the two values as text);
    # None when the module weights are not a contiguous floating-point tensor of `numel` elements
    sample: Callable[[int, Any, int, Any, int], tuple[bool, str, str]]
    samplable: Callable[[Any, int], bool]  # (module weights, numel) -> whether `sample` can compare them


def check_zero_files(files: ZeroRankFiles, checks: list[str], counters: FolderCounters) -> None:
    """Every check, in order; a disagreement raises the refusal naming the odd file."""
    _check_global_steps(files, checks, counters)
    _check_optimizer_steps(files, checks, counters)
    if files.stage < 3:
        _check_slice_mappings(files, checks)
        _check_module_matches_partitions(files, checks)


def _check_global_steps(files: ZeroRankFiles, checks: list[str], counters: FolderCounters) -> None:
    names = files.model_files
    steps = [state.get("global_steps") for state in files.model_states]
    odd = odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        raise AccelkitError(f"{names[odd].name} was saved at step {steps[odd]}, {names[ref].name} at step "
                            f"{steps[ref]}: the rank files come from different steps", hint=ONE_SAVE)
    match = DEFAULT_TAG.match(files.tag)
    if match and steps[0] is not None and int(match.group(1)) != int(steps[0]):
        raise AccelkitError(f"{names[0]} was saved at step {steps[0]}, but its folder is {files.tag}: it comes from "
                            "another step", hint=ONE_SAVE)
    if steps[0] is not None:
        counters.taken += [Counted(float(s), f, "global_steps") for s, f in zip(steps, names, strict=True)]
        skipped = files.model_states[0].get("skipped_steps")
        if isinstance(skipped, (int, float)):
            counters.skipped["deepspeed"] = Counted(float(skipped), names[0], "skipped_steps")
        tag = f" (tag {files.tag})" if match else ""
        checks.append(f"DeepSpeed: every model-states file was saved at step {steps[0]}{tag}")


def _optimizer_steps(files: ZeroRankFiles, rank: int) -> tuple | None:
    base = files.optim_states[rank].get("optimizer_state_dict" if files.stage == 3 else "base_optimizer_state")
    if not isinstance(base, dict) or not isinstance(base.get("state"), dict):
        return None
    steps = []
    for key in sorted(base["state"], key=str):
        entry = base["state"][key]
        steps.append(files.scalar(rank, entry.get("step")) if isinstance(entry, dict) else None)
    return tuple(steps)


def _check_optimizer_steps(files: ZeroRankFiles, checks: list[str], counters: FolderCounters) -> None:
    steps = [_optimizer_steps(files, r) for r in range(files.world)]
    if any(s is None for s in steps) or not any(steps):
        return
    odd = odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        raise AccelkitError(f"{files.optim_files[odd].name} holds optimizer step {steps_text(steps[odd])}, "
                            f"{files.optim_files[ref].name} step {steps_text(steps[ref])}: the rank files "
                            "come from different steps", hint=ONE_SAVE)
    numbers = [float(s) for s in steps[0] if isinstance(s, (int, float))]
    if numbers:
        counters.applied.append(Counted(max(numbers), files.optim_files[0], "optimizer step", owner="deepspeed"))
    checks.append(f"DeepSpeed: the {files.world} optimizer partitions agree on the optimizer step "
                  f"({steps_text(steps[0])})")


def _check_slice_mappings(files: ZeroRankFiles, checks: list[str]) -> None:
    checked = 0
    for rank in range(files.world):
        mappings = files.optim_states[rank].get("param_slice_mappings")
        if not isinstance(mappings, list) or len(mappings) != len(files.partitions):
            continue
        for group, mapping in enumerate(mappings):
            found = {name: fragment(v) for name, v in dict(mapping).items()}
            expected = expected_fragments(files.where, files.partitions, group, rank)
            if found != expected:
                name = next((n for n in sorted(set(found) | set(expected)) if found.get(n) != expected.get(n)), "?")
                raise AccelkitError(
                    f"{files.optim_files[rank].name} holds {name} as {_describe(found.get(name))}, but the "
                    f"model states and partition sizes put it at {_describe(expected.get(name))}: the optimizer and "
                    "model-state files come from different runs", hint=ONE_SAVE)
            checked += 1
    if checked:
        checks.append("DeepSpeed: every rank's partition layout (param_slice_mappings) matches param_shapes")


def _describe(fragment: tuple[int, int] | None) -> str:
    return "nothing" if fragment is None else f"{fragment[0]} values from element {fragment[1]}"


def _check_module_matches_partitions(files: ZeroRankFiles, checks: list[str]) -> None:
    """ZeRO-1/2: sampled elements of each parameter equal in the module weights and the rank's fp32 partition."""
    module = files.model_states[0].get("module") or {}
    model = files.model_files[0]
    mismatched: dict[int, str] = {}
    samples = 0
    for name, where in files.where.items():
        weights = module.get(name)
        if where[0] != "flat12" or not files.samplable(weights, where[3]):
            continue
        _, group, offset, numel = where
        for rank, (start, size) in enumerate(files.partitions[group]):
            lo, hi = max(offset, start), min(offset + numel, start + size)
            flat = files.flats[rank][group]
            for element in sorted({lo, (lo + hi) // 2, hi - 1}) if lo < hi else ():
                same, master, copy = files.sample(rank, flat, element - start, weights, element - offset)
                samples += 1
                if not same:
                    mismatched.setdefault(rank, f"{name}[{element - offset}]: {master} vs {copy}")
    if mismatched:
        if len(mismatched) == files.world and files.world > 1:
            odd = f"{model.name} does not hold the weights of any rank's partition"
        else:
            rank = sorted(mismatched)[0]
            odd = f"{files.optim_files[rank].name} does not hold the weights of {model.name}"
        raise AccelkitError(f"{odd} ({mismatched[sorted(mismatched)[0]]}): the files come from different runs or "
                            "steps", hint=ONE_SAVE)
    if samples:
        checks.append(f"DeepSpeed: the fp32 partitions equal the model-states weights at {samples} sampled "
                      "positions (3 per parameter and rank)")


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
