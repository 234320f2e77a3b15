"""Test probe: records every optimizer step the clock reports, and why the run finished, in the rank's result."""

from __future__ import annotations

from accelkit.ranks.probes.results import write_rank_result
from accelkit.ranks.probes.steps import clock

EVENTS: list[dict] = []


def install() -> None:
    c = clock()
    c.on_step(lambda e: EVENTS.append({"clock_steps": e.clock_steps, "is_clock": e.is_clock, "source": e.source,
                                       "seconds": e.finished - e.started}))
    c.on_finish(lambda reason: write_rank_result("count", {"events": EVENTS, "reason": reason}))
    c.install()
