"""Which rank holds the others back, and in which phase: pure arithmetic over the ranks' step records (no I/O, no
torch), unit-tested on recorded timings.

Data-parallel ranks leave every gradient sync together, so their step times are equal and cannot show a slow rank.
Each rank's own clock can: per measured step, the probe records the time blocked on data loaders (`data_wait_s`),
inside optimizer steps (`optimizer_s`) and waiting at the end of backward for the other ranks' gradients
(`sync_wait_s`, accelkit.bench.sync_wait). The rest of the step is the rank's forward+backward (and whatever else
the loop does between batches):

    compute_s = step - data - optimizer - sync_wait          (each a mean per measured step)

A straggler is slow in its own work (data, compute or optimizer), and the others pay for it as sync wait. The
straggler named is the rank and phase furthest above the other ranks' median for that phase, when it is at least
STRAGGLER_RATIO times that median, at least STRAGGLER_SHARE of the step slower than it, and (where the sync wait
was measured) the other ranks' median sync wait is at least WAITED_SHARE of that excess: the ratio keeps ordinary
rank-to-rank jitter out, the share keeps out phases too short to matter (a 3x slower 1 ms loader), the wait keeps
out a rank that was slow while the others were not waiting for it (a noisy step, a machine's other load).

These are host clocks. On GPUs the kernels and NCCL's collectives run asynchronously: a fast rank's wait for the
others happens on its device streams, and its host blocks later, wherever it next synchronises (a `.item()`, a
copy to the device inside the data loader), so the host phases would put the wait in the wrong phase and could
name the wrong rank. Runs whose ranks used CUDA therefore keep their phases in bench.json but name no straggler
(GPU_NOTE) until the wait is timed on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from accelkit.bench.stats import percentile

PHASES = ("data", "compute", "optimizer")  # a rank's own work; the sync wait is what the others pay for it
PHASE_WORDS = {"data": "loading data", "compute": "in forward+backward", "optimizer": "in the optimizer step"}
STRAGGLER_RATIO = 1.5  # at least 1.5x the other ranks' median for the phase ...
STRAGGLER_SHARE = 0.10  # ... and at least 10% of the step more than it ...
WAITED_SHARE = 0.5  # ... and the others waited in the gradient sync at least half of that excess (when measured)


GPU_NOTE = ("no straggler named: the per-rank phases are host-clock times, and on GPUs a rank's wait for the "
            "others happens on its device streams, where the host clock does not see it")


@dataclass(frozen=True)
class RankPhases:
    """One rank's mean seconds per measured step, by phase (they add up to `step_s`)."""

    rank: int
    step_s: float
    data_s: float
    compute_s: float
    optimizer_s: float
    sync_wait_s: float | None  # None: not measured (no backward of the stepped parameters ran)

    def seconds(self, phase: str) -> float:
        return float(getattr(self, f"{phase}_s"))

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Straggler:
    rank: int
    phase: str  # one of PHASES
    seconds: float  # the straggler's mean seconds per step in that phase
    others_median_s: float  # the other ranks' median of the same
    others_wait_s: float | None  # the other ranks' median sync wait per step (what the straggler costs them)
    step_s: float

    @property
    def ratio(self) -> float | None:
        return self.seconds / self.others_median_s if self.others_median_s > 0 else None

    def line(self) -> str:
        times = f"{self.ratio:.1f}x" if self.ratio is not None else "against 0 s on"
        text = (f"straggler: rank {self.rank} spends {_seconds(self.seconds)} per step {PHASE_WORDS[self.phase]}, "
                f"{times} the other ranks' median ({_seconds(self.others_median_s)})")
        if self.others_wait_s is not None:
            text += f"; the other ranks wait {_seconds(self.others_wait_s)} per step for it in the gradient sync"
        return text

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "phase": self.phase, "seconds_per_step": self.seconds,
                "others_median_s": self.others_median_s, "ratio": self.ratio, "others_sync_wait_s": self.others_wait_s,
                "threshold": {"ratio": STRAGGLER_RATIO, "share_of_step": STRAGGLER_SHARE,
                              "others_waited_share": WAITED_SHARE}}


def _seconds(value: float) -> str:
    return f"{value:.2f} s" if value >= 0.1 else f"{value * 1000:.1f} ms"


def rank_phases(ranks: Sequence[dict[str, Any]], warmup: int) -> list[RankPhases]:
    """Each rank's phases over the measured steps (the steps after warmup that every rank completed)."""
    if not ranks:
        return []
    done = min(len(rank["steps"]) for rank in ranks)
    out = []
    for rank in ranks:
        measured = rank["steps"][warmup:done]
        if not measured:
            return []
        count = len(measured)
        step = sum(s["seconds"] for s in measured) / count
        data = sum(s["data_wait_s"] for s in measured) / count
        optimizer = sum(s.get("optimizer_s") or 0.0 for s in measured) / count
        waits = [s.get("sync_wait_s") for s in measured]
        wait = sum(w for w in waits if w is not None) / count if any(w is not None for w in waits) else None
        compute = max(0.0, step - data - optimizer - (wait or 0.0))
        out.append(RankPhases(int(rank.get("rank", len(out))), step, data, compute, optimizer, wait))
    return out


def straggler_of(ranks: Sequence[dict[str, Any]], phases: Sequence[RankPhases]) -> tuple[Straggler | None, str | None]:
    """The straggler of a run, or why none can be named from its phases (a note; None when they were looked at)."""
    if len(phases) > 1 and any(rank.get("gpu_async") for rank in ranks):
        return None, GPU_NOTE
    return find_straggler(phases), None


def find_straggler(phases: Sequence[RankPhases]) -> Straggler | None:
    """The rank and phase furthest above the other ranks' median, when past the thresholds; None otherwise (one
    rank, or no rank slow enough to matter, or none the others waited for)."""
    if len(phases) < 2:
        return None
    step = max(p.step_s for p in phases)
    best: tuple[float, Straggler] | None = None
    for candidate in phases:
        others = [p for p in phases if p is not candidate]
        waits = [p.sync_wait_s for p in others if p.sync_wait_s is not None]
        waited = percentile(waits, 50) if waits else None
        for phase in PHASES:
            value = candidate.seconds(phase)
            median = percentile([p.seconds(phase) for p in others], 50)
            excess = value - median
            if value < STRAGGLER_RATIO * median or excess < STRAGGLER_SHARE * step or excess <= 0:
                continue
            if waited is not None and waited < WAITED_SHARE * excess:
                continue  # the others did not wait for it
            if best is None or excess > best[0]:
                best = (excess, Straggler(candidate.rank, phase, value, median, waited, step))
    return best[1] if best else None
