"""Every step counter a checkpoint folder carries, cross-checked: the files of one folder must come from one save.

A folder mixed from two saves (the manifest and model of step 10, the RNG and optimizer files of step 20) passes
every per-file check: each file is intact, and the manifest only hashes the files the merge reads. What gives it
away is that the counters the files carry disagree. Counters of the same meaning are compared exactly:

- optimizer steps *taken*: the manifest's `step` (accelkit's templates record the optimizer steps completed) and
  DeepSpeed's `global_steps` (every rank's model states) must be equal;
- optimizer updates *applied*: the `step` of torch's Adam/AdamW and friends in the optimizer state (the largest over
  its parameters: a parameter frozen for a while counts fewer). It equals the steps taken, except that a loss scaler
  (fp16) skips the update of a step whose gradients overflowed: then DeepSpeed records exactly how many
  (`skipped_steps`: applied = taken - skipped), and with Accelerate's saved `scaler.pt` applied may only be fewer;
- the learning rate: a scheduler's last learning rate (`_last_lr` in `scheduler.bin`, or a registered scheduler's
  `custom_checkpoint_<i>.pkl`) is what it set in the optimizer's parameter groups, so the two must be equal.

Accelerate's own `step` in the RNG files counts micro-batches since the start of the epoch (it restarts every
epoch): it is compared across ranks (savestate), not with these. With several optimizers or schedulers in one
folder, which counts what is the script's business: optimizer and scheduler counters are then reported, not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from accelkit.errors import AccelkitError

ONE_SAVE = "copy the complete checkpoint folder of one save (every file of the same step) into a clean folder"


@dataclass(frozen=True)
class Counted:
    """One counter read from one file. `owner` names the optimizer or scheduler it belongs to."""

    value: float
    file: Path
    what: str  # e.g. "optimizer step", "global_steps", "step"
    owner: str = ""


@dataclass
class FolderCounters:
    taken: list[Counted] = field(default_factory=list)  # optimizer steps taken (manifest, DeepSpeed global_steps)
    applied: list[Counted] = field(default_factory=list)  # updates applied (an optimizer's own step counter)
    skipped: dict[str, Counted] = field(default_factory=dict)  # owner -> updates a loss scaler skipped (DeepSpeed)
    optimizer_lrs: list[tuple[str, Path, list[float]]] = field(default_factory=list)  # (owner, file, lr per group)
    scheduler_lrs: list[tuple[Path, list[float]]] = field(default_factory=list)
    scaler: Path | None = None  # a loss scaler's state beside the optimizer: updates may have been skipped


def _number(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _refuse(a: Counted, b: Counted, relation: str = "") -> AccelkitError:
    return AccelkitError(f"{a.file} holds {a.what} {_number(a.value)}, {b.file} {b.what} {_number(b.value)}"
                         f"{relation}: the files come from different saves", hint=ONE_SAVE)


def cross_check(found: FolderCounters) -> str | None:
    """Refuse any disagreement (naming both files); the check line when anything was compared."""
    compared: list[str] = []
    for other in found.taken[1:]:
        if other.value != found.taken[0].value:
            raise _refuse(found.taken[0], other)
    owners = {c.owner for c in found.applied}
    if found.taken and len(owners) == 1:
        taken = found.taken[0]
        for applied in found.applied:
            skipped = found.skipped.get(applied.owner)
            if skipped is not None:
                if applied.value != taken.value - skipped.value:
                    raise _refuse(applied, taken, f" and {skipped.what} {_number(skipped.value)} in {skipped.file}")
            elif found.scaler is not None:
                if applied.value > taken.value:
                    raise _refuse(applied, taken, " (a loss scaler can skip updates, never add them)")
            elif applied.value != taken.value:
                raise _refuse(applied, taken)
        compared.append(f"optimizer step {_number(found.applied[0].value)} against step {_number(taken.value)} in "
                        f"{taken.file.name}")
    if len(found.taken) > 1:
        compared.insert(0, f"step {_number(found.taken[0].value)} in {len(found.taken)} files ("
                        + ", ".join(f"{c.what} in {c.file.name}" for c in found.taken[:4]) + ")")
    if len(found.optimizer_lrs) == 1 and len(found.scheduler_lrs) == 1:
        (_, opt_file, opt_lrs), (sched_file, sched_lrs) = found.optimizer_lrs[0], found.scheduler_lrs[0]
        if len(opt_lrs) == len(sched_lrs):
            if any(a != b for a, b in zip(opt_lrs, sched_lrs, strict=True)):
                raise AccelkitError(f"{sched_file} last set the learning rate to {_lrs(sched_lrs)}, but {opt_file} "
                                    f"holds {_lrs(opt_lrs)}: the files come from different saves", hint=ONE_SAVE)
            compared.append(f"learning rate {_lrs(opt_lrs)} in the optimizer and the scheduler")
    if not compared:
        return None
    return "step counters agree across the folder: " + "; ".join(compared)


def _lrs(values: list[float]) -> str:
    return ", ".join(f"{v:.6g}" for v in values)
