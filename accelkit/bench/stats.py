"""Pure arithmetic of a benchmark: one run's summary from its ranks' step records, and speedup and efficiency
across the runs of a sweep. No I/O, no torch: unit-tested on recorded timings.

Conventions (see docs/guides/scaling.md):
- a step's time is the slowest rank's (data-parallel ranks wait for each other at every gradient sync);
- ONE statistic per run, the median step time T (robust to the odd slow step: a GC pause, another process), and
  every derived figure comes from it: throughput = samples per step / T (samples per step: all ranks, each batch
  counted once however many tensor/context-parallel ranks share it), tokens/s likewise, speedup(N) =
  throughput(N) / throughput(N0) against the smallest world size N0 of the same backend (or, between layouts of
  one world size, against the first layout), efficiency = speedup / (N / N0). With samples unknown (batches not
  from a data loader) speedup comes from T alone: weak scaling (per-device batch fixed) (N / N0) x T(N0) / T(N);
  strong scaling (global batch fixed) T(N0) / T(N), so efficiency = T(N0) x N0 / (N x T(N)) = T1 / (N x TN);
- its spread: the interquartile range of the step times as a share of T (IQR 10% = the middle half of the steps
  lies within 10% of T); p90 is kept for stragglers;
- noise: a result is flagged when its efficiency is above 100% (superlinear: with data parallelism nearly always
  a baseline slowed by something else) or when the run, or the run it is compared with, spreads by more than
  NOISY_SPREAD; the fix is a longer window (`--min-time`), on a quieter machine;
- data-wait share = time blocked on data loaders / step time, on the most data-bound rank.
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


NOISY_SPREAD = 0.20  # an IQR above 20% of the median step: the machine's other load shows in the figures
SUPERLINEAR = 1.005  # efficiency that shows as above 100%


@dataclass
class RunSummary:
    """What one run measured (after warmup), across its ranks. Rates derive from `step_median_s` alone."""

    steps: int  # measured steps (after warmup), common to every rank
    step_median_s: float
    step_p90_s: float
    step_mean_s: float
    measured_s: float  # the slowest rank's wall time over the measured steps (= the sum of its step times)
    samples: int  # over the measured steps, all ranks (each batch once)
    tokens: int
    samples_per_s: float | None
    tokens_per_s: float | None
    data_wait_share: float
    data_wait_share_per_rank: list[float]
    peak_memory_bytes: int
    peak_memory_per_rank: list[int]
    step_times_s: list[float] = field(default_factory=list)  # slowest rank, per measured step
    step_p25_s: float = 0.0
    step_p75_s: float = 0.0

    @property
    def spread(self) -> float:
        """The interquartile range of the step times as a share of the median (0.1 = 10%)."""
        return (self.step_p75_s - self.step_p25_s) / self.step_median_s if self.step_median_s > 0 else 0.0


class TooFewSteps(ValueError):
    """The ranks completed no step after warmup."""


def summarize(ranks: Sequence[dict[str, Any]], warmup: int, machines: int = 1, batch_replicas: int = 1) -> RunSummary:
    """One run's figures from its ranks' probe results (`bench.rank<R>.json`). On several machines each one reads
    only its own ranks' results: samples and tokens are scaled by `machines` (data-parallel ranks take equal
    batches). `batch_replicas`: how many ranks receive each batch (tp x cp x sp of an N-D layout: the ranks of a
    tensor- or context-parallel group all load the same batch), so it is counted once."""
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
    samples = machines * sum(step["samples"] for steps in measured for step in steps) // batch_replicas
    tokens = machines * sum(step["tokens"] for steps in measured for step in steps) // batch_replicas
    shares = [wait / total if total > 0 else 0.0 for wait, total in zip(per_rank_wait, per_rank_time, strict=True)]
    memory = [int(rank.get("peak_memory_bytes") or 0) for rank in ranks]
    steps = done - warmup
    median = percentile(slowest, 50)
    return RunSummary(
        steps=steps,
        step_median_s=median,
        step_p90_s=percentile(slowest, 90),
        step_mean_s=sum(slowest) / len(slowest),
        measured_s=window,
        samples=samples,
        tokens=tokens,
        samples_per_s=samples / steps / median if samples and median > 0 else None,
        tokens_per_s=tokens / steps / median if tokens and median > 0 else None,
        data_wait_share=max(shares),
        data_wait_share_per_rank=shares,
        peak_memory_bytes=max(memory),
        peak_memory_per_rank=memory,
        step_times_s=slowest,
        step_p25_s=percentile(slowest, 25),
        step_p75_s=percentile(slowest, 75),
    )


@dataclass(frozen=True)
class Scaling:
    baseline_num_processes: int
    speedup: float | None  # None when the run is its own baseline above one process (nothing to compare with)
    efficiency: float | None
    noise: tuple[str, ...] = ()  # why the figures may be noise ("superlinear", "high variance"); () = none seen


def noise_reasons(efficiency: float | None, *summaries: RunSummary) -> tuple[str, ...]:
    """Why a comparison may be noise: a superlinear efficiency, or a run of it whose steps spread too much."""
    reasons = []
    if efficiency is not None and efficiency >= SUPERLINEAR:
        reasons.append("superlinear")
    if any(s.spread > NOISY_SPREAD for s in summaries):
        reasons.append("high variance")
    return tuple(reasons)


def scaling(num_processes: int, summary: RunSummary, baseline_n: int, baseline: RunSummary, mode: str) -> Scaling:
    """Speedup and efficiency of a run against the baseline run (the smallest world size of its backend), both
    from the median step time (through throughput when samples are known: samples per step / median)."""
    ratio = num_processes / baseline_n
    if num_processes == baseline_n and summary is baseline:
        known = baseline_n == 1
        value = 1.0 if known else None
        return Scaling(baseline_n, value, value, noise_reasons(None, summary))
    if summary.samples_per_s and baseline.samples_per_s:
        speedup = summary.samples_per_s / baseline.samples_per_s
    elif mode == "strong":
        speedup = baseline.step_median_s / summary.step_median_s
    else:
        speedup = ratio * baseline.step_median_s / summary.step_median_s
    return Scaling(baseline_n, speedup, speedup / ratio, noise_reasons(speedup / ratio, summary, baseline))

