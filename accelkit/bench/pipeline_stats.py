"""Pure arithmetic of a pipeline layout's run: the bubble each stage measured beside the plan's, and the
point-to-point bytes each stage sent (counted in the rank) beside the plan's figure for the same boundary tensor.

Measured bubble of a pipeline rank: 1 - busy / schedule over its measured steps (accelkit.bench.stage_clock),
averaged over the ranks that hold the same stages (the dp_shard and tp ranks of one pipeline rank). Planned: the
plan's `(p-1)/(m+p-1)` (interleaved `(p-1)/(v*m)`, accelkit.plan.pipeline). Point-to-point bytes per step: the
`send` entries of the rank's counted collectives; computed: the plan's sends of that pipeline rank
(`p2p_sends_of_rank`) x one micro-batch's hidden state (rows x tokens x hidden x element bytes).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from accelkit.bench.comm_count import parse_key


@dataclass(frozen=True)
class StageFigures:
    """One pipeline rank (the stages it runs) of a run."""

    pp_rank: int
    stages: tuple[int, ...]
    bubble: float | None  # measured idle share of the schedule's time (mean over the ranks holding these stages)
    p2p_bytes: int | None  # counted sends per step (the most any rank holding these stages sent)
    p2p_computed: int | None  # the plan's figure for these stages


@dataclass(frozen=True)
class PipelineFigures:
    schedule: str | None  # the plan's name of the schedule that ran (1F1B, ...), None when the plan has no model
    microbatches: int | None
    planned_bubble: float | None
    stages: tuple[StageFigures, ...]

    @property
    def p2p_bytes(self) -> int | None:
        """The busiest pipeline rank's counted sends per step."""
        counted = [s.p2p_bytes for s in self.stages if s.p2p_bytes is not None]
        return max(counted) if counted else None

    @property
    def p2p_computed(self) -> int | None:
        computed = [s.p2p_computed for s in self.stages if s.p2p_computed is not None]
        return max(computed) if computed else None

    def to_json(self) -> dict[str, Any]:
        return {"schedule": self.schedule, "microbatches": self.microbatches, "planned_bubble": self.planned_bubble,
                "p2p_bytes_per_step": self.p2p_bytes, "p2p_computed_bytes_per_step": self.p2p_computed,
                "stages": [{"pp_rank": s.pp_rank, "stages": list(s.stages), "bubble": s.bubble,
                            "p2p_bytes_per_step": s.p2p_bytes, "p2p_computed_bytes_per_step": s.p2p_computed}
                           for s in self.stages]}


def plan_schedule(torch_class: str | None) -> str | None:
    """`Schedule1F1B` (the class that ran) -> the plan's `1F1B`; None for a schedule the plan does not model."""
    from accelkit.plan import Pipeline

    name = (torch_class or "").removeprefix("Schedule")
    return name if name in Pipeline.SCHEDULES else None


def rank_bubble(steps: Sequence[dict[str, Any]]) -> float | None:
    busy = sum(step["pipeline"]["busy_s"] for step in steps if step.get("pipeline"))
    schedule = sum(step["pipeline"]["schedule_s"] for step in steps if step.get("pipeline"))
    return 1 - busy / schedule if schedule > 0 else None


def sent_bytes(comm: dict[str, dict[str, int]] | None) -> int | None:
    if comm is None:
        return None
    return sum(value["bytes"] for key, value in comm.items() if parse_key(key)[0] == "send")


def pipeline_figures(ranks: Sequence[dict[str, Any]], warmup: int, pp: int) -> PipelineFigures | None:
    """A pipeline run's figures from its ranks' probe results; None when no rank ran a pipeline schedule."""
    from accelkit.plan import Pipeline

    ran = [rank for rank in ranks if rank.get("pipeline")]
    if not ran:
        return None
    facts = ran[0]["pipeline"]
    schedule, m = plan_schedule(facts.get("schedule")), facts.get("microbatches")
    plan = Pipeline(pp, schedule, m) if schedule is not None and m else None
    done = min(len(rank["steps"]) for rank in ranks)
    by_pp: dict[tuple[int, ...], list[dict[str, Any]]] = {}
    for rank in ran:
        by_pp.setdefault(tuple(rank["pipeline"]["stages"]), []).append(rank)
    stages = []
    for held, group in sorted(by_pp.items()):
        bubbles = [b for b in (rank_bubble(rank["steps"][warmup:done]) for rank in group) if b is not None]
        sent = [s for s in (sent_bytes(rank.get("comm_per_step")) for rank in group) if s is not None]
        boundary = next((rank["pipeline"]["boundary"] for rank in ran if rank["pipeline"].get("boundary")), None)
        pp_rank = held[0] % pp
        computed = None
        if plan is not None and boundary is not None:
            one = boundary["rows"] * boundary["tokens"] * boundary["hidden"] * boundary["element_bytes"]
            computed = plan.p2p_sends_of_rank(pp_rank) * one
        stages.append(StageFigures(pp_rank, held, sum(bubbles) / len(bubbles) if bubbles else None,
                                   max(sent) if sent else None, computed))
    return PipelineFigures(schedule, m, plan.bubble if plan is not None else None, tuple(stages))
