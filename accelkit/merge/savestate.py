"""The files Accelerate's `save_state` (or transformers' Trainer) writes beside the model must come from the same
save as the model.

An Accelerate checkpoint folder holds, beside the weights (`pytorch_model_fsdp_0/`, DeepSpeed's `pytorch_model/`,
or `model.safetensors`), one `random_states_<rank>.pkl` per process, the optimizer (`optimizer_0/` DCP shards for
FSDP, `optimizer.bin` otherwise), and the scheduler and other registered objects (`scheduler.bin`,
`custom_checkpoint_<i>.pkl`). What must agree, and is checked:

- one RNG file per rank of the model checkpoint (a 3-rank folder with a 2-rank model is a mix of runs);
- the `step` every RNG file records (Accelerate's own step counter, the same on every process);
- the optimizer's step counters (torch's Adam/AdamW `step` per parameter): in a DCP optimizer they are spread over
  the rank files, and a rank file from another step disagrees; its rank count must be the model's.

A Trainer checkpoint (`checkpoint-N/`) holds `trainer_state.json` (its `global_step`), `scheduler.pt` (stepped once
per optimizer step: its `last_epoch` is the global step) and `rng_state_<rank>.pth` per process (no step in them:
counted and read, not step-checked); its optimizer is the same `optimizer_0/` (FSDP) or `optimizer.pt`.

The optimizer's step and learning rate, the scheduler's learning rate and a loss scaler's presence are collected
for `counters`, which compares them with the manifest and DeepSpeed's counters. All files are loaded with
`weights_only=True` (RNG states need numpy's array type, which is allowlisted for them alone).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.merge import dcp
from accelkit.merge.counters import Counted, FolderCounters
from accelkit.merge.extras import RNG_FILE, TRAINER_RNG_FILE, TRAINER_STATE, listing
from accelkit.merge.records import RecordReader, TorchArchive
from accelkit.merge.torch_files import materialise

_OPTIMIZER_DCP = re.compile(r"^optimizer_(\d+)$")
_OPTIMIZER_FILE = re.compile(r"^optimizer(_\d+)?\.(bin|pt)$")
_SCHEDULER_FILE = re.compile(r"^(scheduler(_\d+)?\.bin|scheduler\.pt|custom_checkpoint_\d+\.pkl)$")
_SCALER_FILE = "scaler.pt"
_LR_ITEM = re.compile(r"^(?:optimizer\.)?param_groups\.(\d+)\.lr$")
_ONE_SAVE = "copy the complete checkpoint folder of one save_state call (every rank's files) into a clean folder"


def _numpy_globals() -> list:
    import numpy as np

    core = getattr(np, "_core", None) or np.core
    found = [core.multiarray._reconstruct, np.ndarray, np.dtype]
    found += [getattr(np.dtypes, n) for n in dir(getattr(np, "dtypes", object())) if n.endswith("DType")]
    return found


def check_save_state(folder: Path, world_size: int | None, reader: RecordReader,
          counters: FolderCounters | None = None) -> list[str]:
    """Check the save_state files in `folder` against each other and the model's world size, and collect their
    step counters into `counters`; return what held."""
    counters = counters if counters is not None else FolderCounters()
    checks = []
    rng = {int(m.group(1)): p for p in listing(folder) if (m := RNG_FILE.match(p.name))}
    if rng:
        checks.append(_check_rng(folder, rng, world_size, reader))
    trainer_rng = {int(m.group(1) or 0): p for p in listing(folder) if (m := TRAINER_RNG_FILE.match(p.name))}
    if trainer_rng:
        checks.append(_check_trainer_rng(folder, trainer_rng, world_size))
    trainer = _collect_trainer_state(folder / TRAINER_STATE, counters)
    optimizers = [p for p in listing(folder)
                  if _OPTIMIZER_DCP.match(p.name) and (p / dcp.METADATA_FILE).is_file()]
    for path in sorted(optimizers):
        line = _check_optimizer_dcp(path, world_size, reader, counters)
        if line:
            checks.append(line)
    for path in sorted(p for p in listing(folder) if _OPTIMIZER_FILE.match(p.name)):
        _collect_optimizer_file(path, reader, counters)
    for path in sorted(p for p in listing(folder) if _SCHEDULER_FILE.match(p.name)):
        _collect_scheduler(path, counters, steps_once=trainer)
    if (folder / _SCALER_FILE).is_file():
        counters.scaler = folder / _SCALER_FILE
    return checks


def _value(archive: TorchArchive, reader: RecordReader, value: object) -> object:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return materialise(archive, reader, value).item()
    return value


def _collect_optimizer_file(path: Path, reader: RecordReader, counters: FolderCounters) -> None:
    """`optimizer.bin` (torch's optimizer state dict): the largest step over its parameters, each group's lr. An
    optimizer that cannot be read with weights_only (a custom one) carries no counter merge can use: skipped."""
    try:
        archive = TorchArchive.open(path, [])
    except AccelkitError:
        return
    state = archive.obj if isinstance(archive.obj, dict) else {}
    steps = [_value(archive, reader, s.get("step")) for s in (state.get("state") or {}).values() if isinstance(s, dict)]
    steps = [float(s) for s in steps if isinstance(s, (int, float))]
    if steps:
        counters.applied.append(Counted(max(steps), path, "optimizer step", owner=path.name))
    lrs = [g.get("lr") for g in state.get("param_groups") or [] if isinstance(g, dict)]
    if lrs and all(isinstance(lr, (int, float)) for lr in lrs):
        counters.optimizer_lrs.append((path.name, path, [float(lr) for lr in lrs]))


def _collect_scheduler(path: Path, counters: FolderCounters, *, steps_once: bool = False) -> None:
    """A scheduler's state (prepared: scheduler.bin; registered: custom_checkpoint_<i>.pkl; the Trainer's:
    scheduler.pt): its last lr, and with `steps_once` (the Trainer steps its scheduler once per optimizer step;
    Accelerate's prepared one steps once per process) its step count. Objects that are not schedulers, or cannot be
    read with weights_only, are not counters."""
    try:
        state = TorchArchive.open(path, []).obj
    except AccelkitError:
        return
    if isinstance(state, dict) and "last_epoch" in state and isinstance(state.get("_last_lr"), list):
        lrs = state["_last_lr"]
        if lrs and all(isinstance(lr, (int, float)) for lr in lrs):
            counters.scheduler_lrs.append((path, [float(lr) for lr in lrs]))
        epoch = state.get("last_epoch")
        if steps_once and isinstance(epoch, int) and not isinstance(epoch, bool):
            counters.taken.append(Counted(float(epoch), path, "scheduler step (last_epoch)"))


def _collect_trainer_state(path: Path, counters: FolderCounters) -> bool:
    """transformers' Trainer: trainer_state.json's global_step (optimizer steps taken) joins the step counters.
    False when the folder has none (not a Trainer checkpoint)."""
    import json

    if not path.is_file():
        return False
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AccelkitError(f"cannot read {path}: {exc}", hint=_ONE_SAVE) from None
    step = state.get("global_step") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
        raise AccelkitError(f"{path} has no global_step: not the trainer_state.json transformers' Trainer writes",
                            hint=_ONE_SAVE)
    counters.taken.insert(0, Counted(float(step), path, "global_step"))
    return True


def _check_rng_files_complete(folder: Path, rng: dict[int, Path], world_size: int | None, pattern: str) -> None:
    """One RNG file per process, numbered from 0 with no gap, as many as the processes that saved the model."""
    missing = [r for r in range(max(rng) + 1) if r not in rng]
    if missing:
        raise AccelkitError(f"{folder} has no {pattern.format(missing[0])} but has {pattern.format(max(rng))}",
                            hint=_ONE_SAVE)
    if world_size is not None and len(rng) != world_size:
        raise AccelkitError(f"{folder} holds RNG states of {len(rng)} processes ({pattern.format('*')}) but the "
                            f"model was saved by {world_size}: files of runs with different world sizes are mixed",
                            hint=_ONE_SAVE)


def _check_trainer_rng(folder: Path, rng: dict[int, Path], world_size: int | None) -> str:
    """One rng_state_<rank>.pth per process of the model, each a readable RNG state. They record no step: what
    they hold cannot be compared with the step counters, and the line says so."""
    _check_rng_files_complete(folder, rng, world_size, "rng_state_{}.pth")
    for path in rng.values():
        state = TorchArchive.open(path, _numpy_globals()).obj
        if not isinstance(state, dict) or "cpu" not in state:
            raise AccelkitError(f"{path} is not an RNG state the Trainer writes (no `cpu` generator state)",
                                hint=_ONE_SAVE)
    names = ", ".join(p.name for _, p in sorted(rng.items())[:4]) + (", ..." if len(rng) > 4 else "")
    return (f"Trainer: one RNG file per process ({names}: {len(rng)}), each a readable RNG state; they record no "
            "step, so their step cannot be checked")


def _check_rng(folder: Path, rng: dict[int, Path], world_size: int | None, reader: RecordReader) -> str:
    _check_rng_files_complete(folder, rng, world_size, "random_states_{}.pkl")
    steps = {}
    for rank, path in sorted(rng.items()):
        archive = TorchArchive.open(path, _numpy_globals())
        state = archive.obj
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            step = materialise(archive, reader, step).item()
        steps[rank] = step
    values = list(steps.values())
    if any(v != values[0] for v in values):
        odd = next(r for r, v in steps.items() if v != _majority(values))
        ref = next(r for r, v in steps.items() if v == _majority(values) and r != odd)
        raise AccelkitError(f"{rng[odd]} was saved at step {steps[odd]}, random_states_{ref}.pkl at step {steps[ref]}: "
                            "the rank files come from different saves", hint=_ONE_SAVE)
    return f"Accelerate save_state: the RNG files of all {len(rng)} processes were saved at step {values[0]}"


def _majority(values: list) -> object:
    counts = {v: values.count(v) for v in values}
    best = max(counts.values())
    return next(v for v in values if counts[v] == best)  # a tie: the first file wins


def _check_optimizer_dcp(path: Path, world_size: int | None, reader: RecordReader,
                         counters: FolderCounters) -> str | None:
    """The optimizer's step counters agree across its rank files, and it was saved by as many ranks as the model;
    its largest step and its learning rates go to `counters`."""
    metadata = dcp.read_metadata(path)
    ranks = {int(m.group(1)) for info in metadata.storage_data.values() if (m := dcp.DISTCP.match(
        info.relative_path))}
    if world_size is not None and ranks and max(ranks) + 1 != world_size:
        raise AccelkitError(f"{path} was saved by {max(ranks) + 1} processes but the model by {world_size}: files of "
                            "runs with different world sizes are mixed", hint=_ONE_SAVE)
    by_file: dict[str, set] = defaultdict(set)
    lrs: dict[int, float] = {}
    for index, info in metadata.storage_data.items():
        group = _LR_ITEM.match(index.fqn)
        if group and int(group.group(1)) not in lrs:
            value = TorchArchive.open(path / info.relative_path, [], start=info.offset, length=info.length,
                                      what=f"the item of {index.fqn} in {path / info.relative_path}").obj
            if isinstance(value, (int, float)):
                lrs[int(group.group(1))] = float(value)
        if not index.fqn.endswith(".step"):
            continue
        archive = TorchArchive.open(path / info.relative_path, [], start=info.offset, length=info.length,
                                    what=f"the item of {index.fqn} in {path / info.relative_path}")
        value = archive.obj
        if isinstance(value, torch.Tensor):
            value = materialise(archive, reader, value).item()
        if isinstance(value, (int, float)):
            by_file[info.relative_path].add(float(value))
    if by_file:
        top = max((max(v), rel) for rel, v in by_file.items())
        counters.applied.append(Counted(top[0], path / top[1], "optimizer step", owner=path.name))
    if lrs and sorted(lrs) == list(range(len(lrs))):
        counters.optimizer_lrs.append((path.name, path, [lrs[g] for g in sorted(lrs)]))
    uniform = {rel: next(iter(values)) for rel, values in sorted(by_file.items()) if len(values) == 1}
    if len(uniform) < 2 or len(uniform) != len(by_file):
        return None  # one file, or parameters that legitimately stepped differently: nothing to compare
    values = list(uniform.values())
    if any(v != values[0] for v in values):
        common = _majority(values)
        odd = next(rel for rel, v in uniform.items() if v != common)
        ref = next(rel for rel, v in uniform.items() if v == common and rel != odd)
        raise AccelkitError(f"{path / odd} holds optimizer step {uniform[odd]:g}, {ref} step {uniform[ref]:g}: the "
                            "rank files come from different saves", hint=_ONE_SAVE)
    return (f"{path.name}/ agrees with itself (optimizer step {values[0]:g} in all "
            f"{len(uniform)} rank files) and with the model's world size")
