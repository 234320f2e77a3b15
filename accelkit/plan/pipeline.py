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
  1F1B's (Narayanan et al. 2021).
- bubble: the idle share of a step, (p-1)/(m+p-1) for GPipe and 1F1B; interleaving divides the warm-up by v, and
  the plan reports Narayanan et al.'s (p-1)/(v*m) for it.
- point-to-point: every stage boundary a micro-batch crosses sends its hidden state forward and its gradient
  back, so a rank sends 2 * v * m boundary tensors per step, one fewer per micro-batch for the first stage (no
  gradient to send back) and for the last (no output to send on); the plan counts the busiest rank (with p = 2
  and one stage per rank, m each: counted by `bench --layouts` in the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from accelkit.errors import AccelkitError

# torch.distributed.pipelining's schedule class names (what `--pp-schedule` takes, case-insensitive) -> v
SCHEDULES = {"GPipe": 1, "1F1B": 1, "Interleaved1F1B": 2}
DEFAULT_SCHEDULE = "1F1B"


def schedule_name(text: str) -> str:
    """`--pp-schedule` text -> the schedule's name as torch spells it (`interleaved1f1b` -> `Interleaved1F1B`)."""
    by_key = {name.lower().replace("-", "").replace("_", ""): name for name in SCHEDULES}
    key = text.strip().lower().replace("-", "").replace("_", "")
    if key not in by_key:
        raise AccelkitError(f"--pp-schedule {text!r} is not a pipeline schedule the plan models",
                            hint=f"use one of {', '.join(SCHEDULES)} (torch.distributed.pipelining's names)")
    return by_key[key]


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
        return min(m * v, (v - 1) * p + 2 * (p - 1 - rank) + 1)

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


def default_microbatches(ranks: int, schedule: str) -> int:
    """torchtitan's default: one micro-batch per stage of the whole pipeline."""
    return ranks * (SCHEDULES[schedule] if ranks > 1 else 1)


def check_pipeline(pipeline: Pipeline, layers: int | None) -> None:
    """The rules torch.distributed.pipelining and a stage split enforce, before anything is planned."""
    p, m = pipeline.ranks, pipeline.microbatches
    if p == 1:
        return
    if m < p:
        raise AccelkitError(f"--microbatches {m} is fewer than the {p} pipeline stages: every stage would idle",
                            hint=f"give --microbatches {p} or more (a multiple of {p} keeps the bubble small)")
    if pipeline.stages_per_rank > 1 and m % p:
        raise AccelkitError(f"--microbatches {m} does not divide into rounds of {p} for {pipeline.schedule}",
                            hint=f"give a multiple of {p}, e.g. --microbatches {(m // p + 1) * p}")
    if layers is not None and layers < pipeline.stages:
        raise AccelkitError(f"pp {p} with {pipeline.schedule} needs {pipeline.stages} stages, more than the "
                            f"model's {layers} layers", hint="use a smaller pp, or the 1F1B schedule (one stage "
                                                             "per rank)")
