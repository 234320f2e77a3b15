"""Do all the files of a DeepSpeed ZeRO checkpoint come from one save? Every signal DeepSpeed writes is checked.

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

from typing import TYPE_CHECKING

import torch

from accelkit.errors import AccelkitError
from accelkit.merge import deepspeed_layout as layout
from accelkit.merge.counters import Counted
from accelkit.merge.torch_files import materialise, peek_flat

if TYPE_CHECKING:
    from accelkit.merge.deepspeed import DeepSpeedSource

_ONE_SAVE, _DEFAULT_TAG = layout.ONE_SAVE, layout.DEFAULT_TAG
_odd_one, _steps, _fragment = layout.odd_one, layout.steps_text, layout.fragment


def check_all(source: DeepSpeedSource) -> None:
    _check_global_steps(source)
    _check_optimizer_steps(source)
    if source.stage < 3:
        _check_slice_mappings(source)
        _check_module_matches_partitions(source)



def _check_global_steps(source: DeepSpeedSource) -> None:
    files = source.model_files
    steps = [source.model_state(r).get("global_steps") for r in range(len(files))]
    odd = _odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        raise AccelkitError(f"{files[odd].name} was saved at step {steps[odd]}, {files[ref].name} at step "
                            f"{steps[ref]}: the rank files come from different steps", hint=_ONE_SAVE)
    match = _DEFAULT_TAG.match(source.tag)
    if match and steps[0] is not None and int(match.group(1)) != int(steps[0]):
        raise AccelkitError(f"{files[0]} was saved at step {steps[0]}, but its folder is {source.tag}: it comes from "
                            "another step", hint=_ONE_SAVE)
    if steps[0] is not None:
        source.step_counters.taken += [Counted(float(s), f, "global_steps") for s, f in zip(steps, files, strict=True)]
        skipped = source.model_state(0).get("skipped_steps")
        if isinstance(skipped, (int, float)):
            source.step_counters.skipped["deepspeed"] = Counted(float(skipped), files[0], "skipped_steps")
        tag = f" (tag {source.tag})" if match else ""
        source.checks.append(f"DeepSpeed: every model-states file was saved at step {steps[0]}{tag}")


def _optimizer_steps(source: DeepSpeedSource, rank: int) -> tuple | None:
    state = source.optim_state(rank)
    base = state.get("optimizer_state_dict" if source.stage == 3 else "base_optimizer_state")
    if not isinstance(base, dict) or not isinstance(base.get("state"), dict):
        return None
    steps = []
    for key in sorted(base["state"], key=str):
        step = base["state"][key].get("step") if isinstance(base["state"][key], dict) else None
        if isinstance(step, torch.Tensor):
            step = materialise(source.optim_archive(rank), source.reader, step).item()
        steps.append(step)
    return tuple(steps)


def _check_optimizer_steps(source: DeepSpeedSource) -> None:
    world = source.world_size or 1
    steps = [_optimizer_steps(source, r) for r in range(world)]
    if any(s is None for s in steps) or not any(steps):
        return
    odd = _odd_one(steps)
    if odd is not None:
        ref = 0 if odd else 1
        name = source.optim_archive(odd).path.name
        raise AccelkitError(f"{name} holds optimizer step {_steps(steps[odd])}, "
                            f"{source.optim_archive(ref).path.name} step {_steps(steps[ref])}: the rank files come "
                            "from different steps", hint=_ONE_SAVE)
    numbers = [float(s) for s in steps[0] if isinstance(s, (int, float))]
    if numbers:
        source.step_counters.applied.append(Counted(max(numbers), source.optim_archive(0).path, "optimizer step",
                                                    owner="deepspeed"))
    source.checks.append(f"DeepSpeed: the {world} optimizer partitions agree on the optimizer step "
                         f"({_steps(steps[0])})")





def _check_slice_mappings(source: DeepSpeedSource) -> None:
    checked = 0
    for rank in range(source.world_size or 1):
        mappings = source.optim_state(rank).get("param_slice_mappings")
        if not isinstance(mappings, list) or len(mappings) != len(source.partitions):
            continue
        for group, mapping in enumerate(mappings):
            found = {name: _fragment(v) for name, v in dict(mapping).items()}
            expected = layout.expected_fragments(source.where, source.partitions, group, rank)
            if found != expected:
                name = next((n for n in sorted(set(found) | set(expected)) if found.get(n) != expected.get(n)), "?")
                raise AccelkitError(
                    f"{source.optim_archive(rank).path.name} holds {name} as {_describe(found.get(name))}, but the "
                    f"model states and partition sizes put it at {_describe(expected.get(name))}: the optimizer and "
                    "model-state files come from different runs", hint=_ONE_SAVE)
            checked += 1
    if checked:
        source.checks.append("DeepSpeed: every rank's partition layout (param_slice_mappings) matches param_shapes")


def _describe(fragment: tuple[int, int] | None) -> str:
    return "nothing" if fragment is None else f"{fragment[0]} values from element {fragment[1]}"


def _check_module_matches_partitions(source: DeepSpeedSource) -> None:
    """ZeRO-1/2: sampled elements of each parameter equal in the module weights and the rank's fp32 partition."""
    module = source.model_state(0).get("module") or {}
    model = source.model_archive(0)
    mismatched: dict[int, str] = {}
    samples = 0
    for name, where in source.where.items():
        weights = module.get(name)
        if where[0] != "flat12" or not isinstance(weights, torch.Tensor) or not weights.is_floating_point():
            continue
        _, group, offset, numel = where
        if weights.numel() != numel or not weights.is_contiguous():
            continue
        for rank, (start, size) in enumerate(source.partitions[group]):
            lo, hi = max(offset, start), min(offset + numel, start + size)
            flat = source.flat_groups(rank)[group]
            for element in sorted({lo, (lo + hi) // 2, hi - 1}) if lo < hi else ():
                master = peek_flat(source.optim_archive(rank), source.reader, flat, element - start)
                copy = peek_flat(model, source.reader, weights, element - offset)
                samples += 1
                if not _same_bits(master.to(copy.dtype), copy):
                    mismatched.setdefault(rank, f"{name}[{element - offset}]: {master.item()!r} vs {copy.item()!r}")
    if mismatched:
        world = source.world_size or 1
        if len(mismatched) == world and world > 1:
            odd = f"{model.path.name} does not hold the weights of any rank's partition"
        else:
            rank = sorted(mismatched)[0]
            odd = f"{source.optim_archive(rank).path.name} does not hold the weights of {model.path.name}"
        raise AccelkitError(f"{odd} ({mismatched[sorted(mismatched)[0]]}): the files come from different runs or "
                            "steps", hint=_ONE_SAVE)
    if samples:
        source.checks.append(f"DeepSpeed: the fp32 partitions equal the model-states weights at {samples} sampled "
                             "positions (3 per parameter and rank)")


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch.equal(a.reshape(1).view(torch.uint8), b.reshape(1).view(torch.uint8)))
