"""Do all the files of a DeepSpeed ZeRO checkpoint come from one save? Every signal DeepSpeed writes is checked,
once, for both readers (deepspeed with torch, light_deepspeed without): each reader hands its files over as
`ZeroRankFiles`, with two small callables that read a tensor of its own kind. No torch here.

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

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accelkit.errors import AccelkitError
from accelkit.merge import deepspeed_layout as layout
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
    odd = layout.odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        raise AccelkitError(f"{names[odd].name} was saved at step {steps[odd]}, {names[ref].name} at step "
                            f"{steps[ref]}: the rank files come from different steps", hint=layout.ONE_SAVE)
    match = layout.DEFAULT_TAG.match(files.tag)
    if match and steps[0] is not None and int(match.group(1)) != int(steps[0]):
        raise AccelkitError(f"{names[0]} was saved at step {steps[0]}, but its folder is {files.tag}: it comes from "
                            "another step", hint=layout.ONE_SAVE)
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
    odd = layout.odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        raise AccelkitError(f"{files.optim_files[odd].name} holds optimizer step {layout.steps_text(steps[odd])}, "
                            f"{files.optim_files[ref].name} step {layout.steps_text(steps[ref])}: the rank files "
                            "come from different steps", hint=layout.ONE_SAVE)
    numbers = [float(s) for s in steps[0] if isinstance(s, (int, float))]
    if numbers:
        counters.applied.append(Counted(max(numbers), files.optim_files[0], "optimizer step", owner="deepspeed"))
    checks.append(f"DeepSpeed: the {files.world} optimizer partitions agree on the optimizer step "
                  f"({layout.steps_text(steps[0])})")


def _check_slice_mappings(files: ZeroRankFiles, checks: list[str]) -> None:
    checked = 0
    for rank in range(files.world):
        mappings = files.optim_states[rank].get("param_slice_mappings")
        if not isinstance(mappings, list) or len(mappings) != len(files.partitions):
            continue
        for group, mapping in enumerate(mappings):
            found = {name: layout.fragment(v) for name, v in dict(mapping).items()}
            expected = layout.expected_fragments(files.where, files.partitions, group, rank)
            if found != expected:
                name = next((n for n in sorted(set(found) | set(expected)) if found.get(n) != expected.get(n)), "?")
                raise AccelkitError(
                    f"{files.optim_files[rank].name} holds {name} as {_describe(found.get(name))}, but the "
                    f"model states and partition sizes put it at {_describe(expected.get(name))}: the optimizer and "
                    "model-state files come from different runs", hint=layout.ONE_SAVE)
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
                            "steps", hint=layout.ONE_SAVE)
    if samples:
        checks.append(f"DeepSpeed: the fp32 partitions equal the model-states weights at {samples} sampled "
                      "positions (3 per parameter and rank)")
