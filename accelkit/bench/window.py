"""How long a run measures: at least `min_steps` steps AND at least `min_time` seconds of them (the way
`timeit`'s autorange and pyperf calibrate: a window too short to average out the machine's other load gives
figures that are noise). Pure arithmetic here; the probe applies it on every rank.

Every rank must stop after the same step (the others would wait forever in the next collective), so the decision
is taken only at checkpoints: the first after `min_steps` measured steps; there the ranks agree on the longest
measured time (one small all-reduce, `agree_seconds`), and either stop or all move the checkpoint to the step count
that this time projects to reach the window. Checkpoints are few (usually two or three per run), and the time of
the agreement itself is left out of the steps.
"""

from __future__ import annotations

import math

OVERSHOOT = 1.05  # aim slightly past the window, so the projection rarely falls just short of it
MAX_GROWTH = 16  # never project more than this many times the steps measured so far (first steps can mislead)


def next_checkpoint(measured_steps: int, measured_seconds: float, min_time: float, min_steps: int) -> int | None:
    """The number of measured steps to reach before deciding again, or None when the window is complete."""
    if measured_steps >= min_steps and measured_seconds >= min_time:
        return None
    if measured_steps < min_steps:
        return min_steps
    per_step = measured_seconds / measured_steps if measured_seconds > 0 else 0.0
    wanted = math.ceil(min_time * OVERSHOOT / per_step) if per_step > 0 else measured_steps * MAX_GROWTH
    return max(measured_steps + 1, min(wanted, measured_steps * MAX_GROWTH))


def agree_seconds(seconds: float) -> float | None:
    """The longest `seconds` across the job's ranks (every rank calls this at the same step), or None when the
    ranks cannot agree (several processes but no process group): the window then stays fixed."""
    import os
    import sys

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return seconds
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    import torch

    backend = str(dist.get_backend())
    device = torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend and "gloo" not in backend \
        else torch.device("cpu")
    value = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())
