"""Pipeline parallelism in the plan: how a schedule of torch.distributed.pipelining splits the layers into stages,
how many micro-batches each rank keeps in flight, the bubble, and the point-to-point bytes.

p pipeline ranks, v stages per rank (1 for GPipe and 1F1B, 2 for Interleaved1F1B: torchtitan's default for looped
schedules), m micro-batches per step:

- stages: the decoder layers split over p*v stages in order (the first `L mod (p*v)` stages one layer more); the
  input embedding joins stage 0, the final norm and the output head the last stage. Rank r runs stages r, r+p, ...
- in flight (what a rank keeps for the backward, counted in stage-micro-batches): GPipe runs every forward first,
  so m per stage; 1F1B starts its first backward after p - r forwards on rank r, so min(m, p - r); Interleaved1F1B
  warms up with (v-1)*p + 2*(p-1-r) forwards before its first backward (torch's `_get_1f1b_rank_ops`), so
  min(m*v, (v-1)*p + 2*(p-1-r) + 1) stage-micro-batches of L/(p*v) layers: on rank 0 that is 1 + (p-1)/(p*v) times
  1F1B's (Narayanan et al. 2021). InterleavedZeroBubble splits each backward into its input and weight gradients
  and warms up with one forward per hop instead of two ((v-1)*p + (p-1-r), torch's `_get_warmup_ops` with
  multiply_factor=1), so it keeps min(m*v, (v-1)*p + (p-1-r) + 1); the inputs kept for the deferred weight
  gradients are not counted.
- bubble: the idle share of a step, (p-1)/(m+p-1) for GPipe and 1F1B; interleaving divides the warm-up by v, and
  the plan reports Narayanan et al.'s (p-1)/(v*m) for it; for InterleavedZeroBubble that figure is an upper bound
  (its deferred weight gradients fill part of the bubble, by how much depends on their time).
- point-to-point: every stage boundary a micro-batch crosses sends its hidden state forward and its gradient
  back, so a rank sends 2 * v * m boundary tensors per step, one fewer per micro-batch for the first stage (no
  gradient to send back) and for the last (no output to send on); the plan counts the busiest rank (with p = 2
  and one stage per rank, m each: counted by `bench --layouts` in the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accelkit import pipeline_schedules
from accelkit.errors import AccelkitError

# The schedules the plan models, by torch's class names less `Schedule` -> v; their names, spellings and the rules on
# micro-batches are accelkit.pipeline_schedules', shared with config, launch and bench.
SCHEDULES = {s.torch_name: s.stages_per_rank for s in pipeline_schedules.SCHEDULES}
DEFAULT_SCHEDULE = pipeline_schedules.DEFAULT_SCHEDULE.torch_name
ZERO_BUBBLE = "InterleavedZeroBubble"


def schedule_name(text: str) -> str:
    """`--pp-schedule` text in any accepted spelling -> torch's spelling (`interleaved1f1b` -> `Interleaved1F1B`)."""
    return pipeline_schedules.parse_schedule(text).torch_name


@dataclass(frozen=True)
class Pipeline:
    """p ranks in the pipeline, their schedule and micro-batches per step."""

    SCHEDULES: ClassVar[dict[str, int]] = SCHEDULES  # the schedules modelled (torch's class names less `Schedule`)
    ranks: int = 1
    schedule: str = DEFAULT_SCHEDULE
    microbatches: int = 1

    @property
    def stages_per_rank(self) -> int:
        return SCHEDULES[self.schedule] if self.ranks > 1 else 1

    @property
    def stages(self) -> int:
        return self.ranks * self.stages_per_rank

    def layers_of_stage(self, layers: int) -> list[range]:
        """The decoder layers each stage runs, in order."""
        base, extra = divmod(layers, self.stages)
        out, start = [], 0
        for stage in range(self.stages):
            size = base + (1 if stage < extra else 0)
            out.append(range(start, start + size))
            start += size
        return out

    def stages_of_rank(self, rank: int) -> tuple[int, ...]:
        return tuple(rank + k * self.ranks for k in range(self.stages_per_rank))

    def in_flight(self, rank: int) -> int:
        """Stage-micro-batches rank `rank` keeps activations of at its peak."""
        p, m, v = self.ranks, self.microbatches, self.stages_per_rank
        if p == 1:
            return 1
        if self.schedule == "GPipe":
            return m * v
        if v == 1:
            return min(m, p - rank)
        # torch's _get_warmup_ops: 2 forwards per hop from the last rank, 1 for the zero-bubble schedule (its
        # backward is split, the weight gradients deferred)
        per_hop = 1 if self.schedule == ZERO_BUBBLE else 2
        return min(m * v, (v - 1) * p + per_hop * (p - 1 - rank) + 1)

    def head_in_flight(self) -> int:
        """Micro-batches whose loss inputs (logits) the last stage keeps: all of them under GPipe, one otherwise
        (1F1B and interleaving run the last stage's backward right after its forward)."""
        return self.microbatches if self.schedule == "GPipe" and self.ranks > 1 else 1

    @property
    def bubble(self) -> float:
        p, m, v = self.ranks, self.microbatches, self.stages_per_rank
        if p == 1:
            return 0.0
        return (p - 1) / (v * m) if v > 1 else (p - 1) / (m + p - 1)

    def p2p_sends(self) -> int:
        """Boundary tensors the busiest rank sends per step (forward activations plus backward gradients)."""
        return max((self.p2p_sends_of_rank(rank) for rank in range(self.ranks)), default=0)

    def p2p_sends_of_rank(self, rank: int) -> int:
        """Boundary tensors rank `rank` sends per step: per micro-batch, each of its stages sends its output on
        (all but the last stage) and its input's gradient back (all but the first)."""
        if self.ranks == 1:
            return 0
        last = self.stages - 1
        return self.microbatches * sum((stage != last) + (stage != 0) for stage in self.stages_of_rank(rank))

    def describe(self) -> str:
        if self.ranks == 1:
            return ""
        v = f", {self.stages_per_rank} stages per rank" if self.stages_per_rank > 1 else ""
        return f"{self.schedule}, {self.microbatches} micro-batches{v}"


def check_pipeline(pipeline: Pipeline, layers: int | None) -> None:
    """The rules torch.distributed.pipelining and a stage split enforce, before anything is planned."""
    p, m = pipeline.ranks, pipeline.microbatches
    if p == 1:
        return
    pipeline_schedules.check_microbatches(p, pipeline.schedule, m)
    if layers is not None and layers < pipeline.stages:
        raise AccelkitError(f"pp {p} with {pipeline.schedule} needs {pipeline.stages} stages, more than the "
                            f"model's {layers} layers", hint="use a smaller pp, or the 1F1B schedule (one stage "
                                                             "per rank)")
