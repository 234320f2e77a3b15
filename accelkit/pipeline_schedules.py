"""The pipeline schedules and the micro-batch rules of every command: one vocabulary, one ceiling, one rule set.

`accelkit config`, `launch` and `bench` (--pp-size, --pp-schedule, --microbatches, through the config rule set) and
`accelkit plan` (--layout with pp) all read their schedule names, defaults and refusals here, so a layout one of
them accepts, the others accept too, and a layout one refuses, the others refuse in the same words.

Schedules are torch.distributed.pipelining's classes. A name is accepted in any case, with or without `-` and `_`
(`1f1b`, `1F1B`, `Interleaved1F1B`, `interleaved-1f1b`); config files and $ACCELKIT_PIPELINE carry the lower-case
name, the plan's report torch's spelling.

    name                   torch class                      stages per rank
    gpipe                  ScheduleGPipe                    1
    1f1b                   Schedule1F1B                     1
    interleaved1f1b        ScheduleInterleaved1F1B          2 (looped, virtual stages)
    interleavedzerobubble  ScheduleInterleavedZeroBubble    2 (looped, virtual stages)

Rules on m micro-batches per step over a pipeline of p ranks (p >= 2), checked in this order, the first broken one
reported:
- m >= 1;
- m <= MAX_MICROBATCHES: each micro-batch is a forward and a backward per stage, so more is a typo;
- m >= p: a one-stage schedule refuses fewer (torch's Schedule1F1B raises), and no schedule keeps every rank busy;
- interleaved schedules: m a multiple of p. torch runs them in rounds of m // (m // p) micro-batches and accepts
  any m divisible by its number of rounds, but only a multiple of p makes each round one micro-batch per rank,
  the schedule the plan models (its warm-up, in-flight count and bubble).
"""

from __future__ import annotations

from dataclasses import dataclass

from accelkit.errors import AccelkitError

MAX_MICROBATCHES = 4096  # per step: far above any schedule's useful range (a few per stage), below absurd values


@dataclass(frozen=True)
class Schedule:
    """One pipeline schedule: its name in configs, torch's spelling, and the stages each rank runs."""

    name: str  # as configs and $ACCELKIT_PIPELINE write it
    torch_name: str  # torch.distributed.pipelining's class, less `Schedule`: what the plan reports
    stages_per_rank: int  # 1, or the looped schedules' virtual stages (torchtitan's default, 2)

    @property
    def interleaved(self) -> bool:
        return self.stages_per_rank > 1


SCHEDULES = (Schedule("gpipe", "GPipe", 1), Schedule("1f1b", "1F1B", 1),
             Schedule("interleaved1f1b", "Interleaved1F1B", 2),
             Schedule("interleavedzerobubble", "InterleavedZeroBubble", 2))
SCHEDULE_NAMES = tuple(s.name for s in SCHEDULES)
DEFAULT_SCHEDULE = SCHEDULES[1]  # 1f1b
_BY_KEY = {s.name: s for s in SCHEDULES}


def _key(text: str) -> str:
    return text.strip().lower().replace("-", "").replace("_", "")


def parse_schedule(text: str, where: str = "--pp-schedule") -> Schedule:
    """A schedule's name in any accepted spelling -> its Schedule; AccelkitError naming `where` otherwise."""
    found = _BY_KEY.get(_key(text))
    if found is None:
        raise AccelkitError(f"{where} {text!r} is not a pipeline schedule",
                            hint=f"use one of {', '.join(SCHEDULE_NAMES)} (torch.distributed.pipelining's "
                                 "ScheduleGPipe, Schedule1F1B, ...; any case)")
    return found


def schedule_or_default(text: str | None) -> Schedule:
    return DEFAULT_SCHEDULE if text is None else parse_schedule(text)


def default_microbatches(pp: int, schedule: Schedule | str | None = None) -> int:
    """One micro-batch per stage of the whole pipeline (torchtitan's default): pp, or 2 * pp interleaved."""
    if isinstance(schedule, str) or schedule is None:
        schedule = schedule_or_default(schedule)
    return pp * schedule.stages_per_rank if pp > 1 else 1


@dataclass(frozen=True)
class RuleBreak:
    """A micro-batch count a pipeline cannot run: the rule (for findings), the one line, and the fix."""

    rule: str
    message: str
    hint: str

    def error(self) -> AccelkitError:
        return AccelkitError(self.message, hint=self.hint)


def microbatch_rule_break(pp: int, schedule: Schedule | str | None, microbatches: int, *,
                          said_microbatches: str | None = None, said_schedule: str | None = None) -> RuleBreak | None:
    """The first rule `microbatches` breaks on a pipeline of `pp` ranks running `schedule`, or None.
    `said_*`: how the value was given (default: as flags), so a config file's value is named as the file says it."""
    if pp < 2:
        return None
    schedule = schedule if isinstance(schedule, Schedule) else schedule_or_default(schedule)
    m = microbatches
    said_m = said_microbatches or f"--microbatches {m}"
    good = f"--microbatches {default_microbatches(pp, schedule)}"
    if m < 1:
        return RuleBreak("microbatches-none", f"{said_m}: a pipeline splits each batch into one or more microbatches",
                         f"use {good} (one per stage), or leave it out: that is the default")
    if m > MAX_MICROBATCHES:
        return RuleBreak("microbatches-ceiling", f"{said_m} is above {MAX_MICROBATCHES:,}: each microbatch is a "
                         "separate forward and backward per stage, and the batch is split that many ways",
                         f"use --microbatches between {pp} and {MAX_MICROBATCHES} ({4 * pp} keeps the bubble "
                         "under 20%)")
    if m < pp:
        return RuleBreak("microbatches-below-stages", f"{said_m} is fewer than the {pp} pipeline stages (pp {pp}): "
                         "every schedule needs a microbatch for each stage in flight",
                         f"use --microbatches {pp} or more ({4 * pp} keeps the bubble under 20%)")
    if schedule.interleaved and m % pp:
        said_s = said_schedule or f"--pp-schedule {schedule.name}"
        return RuleBreak("microbatches-rounds", f"{said_m} with {said_s}: the interleaved schedules run the "
                         f"microbatches in rounds of one per pipeline rank, and {m} is not a multiple of pp {pp}",
                         f"use a multiple of {pp}, e.g. --microbatches {(m // pp + 1) * pp}")
    return None


def check_microbatches(pp: int, schedule: Schedule | str | None, microbatches: int) -> None:
    """Raise the first broken rule as an AccelkitError (plan's --layout, and every library caller)."""
    broken = microbatch_rule_break(pp, schedule, microbatches)
    if broken is not None:
        raise broken.error()
