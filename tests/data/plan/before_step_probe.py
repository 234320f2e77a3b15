"""Test probe: at every on_before_step callback, records whether the gradients are there and the step count."""

from __future__ import annotations

from accelkit.ranks.probes.results import write_rank_result
from accelkit.ranks.probes.steps import clock

SEEN: list[dict] = []


def install() -> None:
    c = clock()

    def before(event) -> None:
        params = [p for group in event.optimizer.param_groups for p in group["params"]]
        SEEN.append({"clock_steps": event.clock_steps, "source": event.source, "is_clock": event.is_clock,
                     "grads": all(p.grad is not None for p in params)})

    c.on_before_step(before)
    c.on_finish(lambda reason: write_rank_result("before", {"seen": SEEN, "reason": reason}))
    c.install()
