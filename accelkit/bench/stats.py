"""Pure arithmetic of a benchmark: one run's summary from its ranks' step records, and speedup and efficiency
across the runs of a sweep. No I/O, no torch: unit-tested on recorded timings.

Conventions (see docs/guides/scaling.md):
- a step's time is the slowest rank's (data-parallel ranks wait for each other at every gradient sync);
  median and p90 are taken over the measured steps (after warmup);
- throughput = samples (all ranks) / the slowest rank's measured wall time; tokens likewise;
- data-wait share = time blocked on data loaders / step time, on the most data-bound rank;
- speedup(N) = throughput(N) / throughput(N0) against the smallest world size N0 of the same backend, and
  efficiency = speedup / (N / N0). With samples unknown (batches not from a data loader) it falls back to step
  times: weak scaling (per-device batch fixed) speedup = (N / N0) x T(N0) / T(N); strong scaling (global batch
  fixed) speedup = T(N0) / T(N), so efficiency = T(N0) x N0 / (N x T(N)), i.e. T1 / (N x TN) from one process.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation between the closest ranks (numpy's default)."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass
class RunSummary:
    """What one run measured (after warmup), across its ranks."""

    steps: int  # measured steps (after warmup), common to every rank
    step_median_s: float
    step_p90_s: float
    step_mean_s: float
    measured_s: float  # the slowest rank's wall time over the measured steps (= the sum of its step times)
    samples: int  # over the measured steps, all ranks
    tokens: int
    samples_per_s: float | None
    tokens_per_s: float | None
    data_wait_share: float
    data_wait_share_per_rank: list[float]
    peak_memory_bytes: int
    peak_memory_per_rank: list[int]
    step_times_s: list[float] = field(default_factory=list)  # slowest rank, per measured step


class TooFewSteps(ValueError):
    """The ranks completed no step after warmup."""


def summarize(ranks: Sequence[dict[str, Any]], warmup: int, machines: int = 1) -> RunSummary:
    """One run's figures from its ranks' probe results (`bench.rank<R>.json`). On several machines each one reads
    only its own ranks' results: samples and tokens are scaled by `machines` (data-parallel ranks take equal
    batches)."""
    if not ranks:
        raise TooFewSteps("no rank wrote a result")
    done = min(len(rank["steps"]) for rank in ranks)
    if done <= warmup:
        raise TooFewSteps(f"the script completed {done} optimizer step(s), not more than the {warmup} warmup step(s)")
    measured = [rank["steps"][warmup:done] for rank in ranks]
    slowest = [max(steps[i]["seconds"] for steps in measured) for i in range(done - warmup)]
    per_rank_time = [sum(step["seconds"] for step in steps) for steps in measured]
    per_rank_wait = [sum(step["data_wait_s"] for step in steps) for steps in measured]
    window = max(per_rank_time)
    samples = machines * sum(step["samples"] for steps in measured for step in steps)
    tokens = machines * sum(step["tokens"] for steps in measured for step in steps)
    shares = [wait / total if total > 0 else 0.0 for wait, total in zip(per_rank_wait, per_rank_time, strict=True)]
    memory = [int(rank.get("peak_memory_bytes") or 0) for rank in ranks]
    return RunSummary(
        steps=done - warmup,
        step_median_s=percentile(slowest, 50),
        step_p90_s=percentile(slowest, 90),
        step_mean_s=sum(slowest) / len(slowest),
        measured_s=window,
        samples=samples,
        tokens=tokens,
        samples_per_s=samples / window if samples and window > 0 else None,
        tokens_per_s=tokens / window if tokens and window > 0 else None,
        data_wait_share=max(shares),
        data_wait_share_per_rank=shares,
        peak_memory_bytes=max(memory),
        peak_memory_per_rank=memory,
        step_times_s=slowest,
    )


@dataclass(frozen=True)
class Scaling:
    baseline_num_processes: int
    speedup: float | None  # None when the run is its own baseline above one process (nothing to compare with)
    efficiency: float | None


def scaling(num_processes: int, summary: RunSummary, baseline_n: int, baseline: RunSummary, mode: str) -> Scaling:
    """Speedup and efficiency of a run against the baseline run (the smallest world size of its backend)."""
    ratio = num_processes / baseline_n
    if num_processes == baseline_n:
        known = baseline_n == 1
        return Scaling(baseline_n, 1.0 if known else None, 1.0 if known else None)
    if summary.samples_per_s and baseline.samples_per_s:
        speedup = summary.samples_per_s / baseline.samples_per_s
    elif mode == "strong":
        speedup = baseline.step_median_s / summary.step_median_s
    else:
        speedup = ratio * baseline.step_median_s / summary.step_median_s
    return Scaling(baseline_n, speedup, speedup / ratio)

