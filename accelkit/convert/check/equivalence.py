"""The weights of the conversion against the original's (checking side): the converted run's rank 0 and the
equivalence run (the original on one process at the conversion's global batch, probe_batch.py) each keep their
weights after every optimizer step (probe.py, WEIGHTS_FILE); this reads both and reduces them to plain numbers,
the largest relative difference of any parameter after each step, which `invariants.weights` judges."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from accelkit.convert.check.record import WEIGHTS_FILE, Record


@dataclass(frozen=True)
class StepDifference:
    position: int  # index of the step in both runs' `Record.steps`
    relative: float  # max |converted - original| / max |original| of the parameter that differs most
    parameter: str  # `Net.fc.weight`


@dataclass(frozen=True)
class Equivalence:
    """What the equivalence run gave: its record (None when it recorded nothing), its failure, the differences."""

    record: Record | None
    failure: str = ""  # `exit status 1: RuntimeError: ...` when it did not run to its end or its step limit
    differences: tuple[StepDifference, ...] = ()


def compare_weights(converted_folder: Path, original_folder: Path) -> tuple[StepDifference, ...]:
    """The steps both runs kept weights for, each with its largest relative difference."""
    import torch

    ours_path, theirs_path = converted_folder / WEIGHTS_FILE, original_folder / WEIGHTS_FILE
    if not ours_path.exists() or not theirs_path.exists():
        return ()
    ours, theirs = torch.load(ours_path, weights_only=True), torch.load(theirs_path, weights_only=True)
    found = []
    for position in sorted(set(ours) & set(theirs)):
        a, b = ours[position], theirs[position]
        pairs = (list(zip(a.items(), b.values(), strict=True)) if len(a) == len(b) else [])
        worst = StepDifference(position, float("inf") if not pairs else 0.0,
                               "" if pairs else f"{len(a)} parameter tensors where the original has {len(b)}")
        for (name, x), y in pairs:
            relative = _relative(x, y)
            if relative > worst.relative:
                worst = StepDifference(position, relative, name)
        found.append(worst)
    return tuple(found)


def _relative(x, y) -> float:
    if x.shape != y.shape:
        return float("inf")
    x, y = x.double(), y.double()
    scale = max(float(y.abs().max()) if y.numel() else 0.0, 1e-12)
    return float((x - y).abs().max()) / scale if x.numel() else 0.0
