"""The pipeline side of the bench probe: how long each pipeline stage computes (its forward and backward of every
micro-batch) inside the schedule's step, and what one micro-batch's boundary tensor is.

torch.distributed.pipelining runs a stage's work through `forward_one_chunk`, `backward_one_chunk` and
`backward_weight_one_chunk` of its `PipelineStage`, and waits for its neighbours' sends before each of them; so
time inside those calls is the stage busy, and the rest of the schedule's `step` is the stage idle (the bubble,
waiting on a neighbour, the send/recv itself). The probe closes one record per optimizer step:

    busy_s      seconds inside the stage's forward/backward calls this step
    schedule_s  seconds inside the schedule's step() calls this step (the pipeline's part of the step)

and the measured bubble of a stage is 1 - busy / schedule over the measured steps. The point-to-point bytes are
counted with the other collectives (accelkit.bench.comm_count sees c10d's send and recv); `facts()` gives what
the computed figure needs: the rank's stages, their number, the micro-batches and the boundary tensor's size.
"""

from __future__ import annotations

import functools
import time
from typing import Any

_STAGE_CALLS = ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
_SCHEDULES = ("PipelineScheduleSingle", "PipelineScheduleMulti")


class StageClock:
    """Accumulates this rank's stage compute and schedule time between two optimizer steps."""

    def __init__(self) -> None:
        self.busy = 0.0
        self.schedule = 0.0
        self.stages: dict[int, int] = {}  # stage index -> number of stages (each stage this rank runs)
        self.microbatches: int | None = None
        self.schedule_name: str | None = None
        self.boundary: dict[str, Any] | None = None  # one micro-batch's hidden state: rows, tokens, hidden, bytes
        self._depth = 0

    def close_step(self) -> dict[str, float] | None:
        """This step's pipeline times (None when no schedule ran), and a fresh start for the next step."""
        if not self.schedule:
            return None
        out = {"busy_s": self.busy, "schedule_s": self.schedule}
        self.busy = self.schedule = 0.0
        return out

    def facts(self) -> dict[str, Any] | None:
        if not self.stages:
            return None
        return {"stages": sorted(self.stages), "num_stages": next(iter(self.stages.values())),
                "microbatches": self.microbatches, "schedule": self.schedule_name, "boundary": self.boundary}

    # -- hooks ------------------------------------------------------------------------------------------------
    def install(self) -> None:
        from accelkit.ranks.probes import after_import

        after_import("torch.distributed.pipelining.stage", self._hook_stage)
        after_import("torch.distributed.pipelining.schedules", self._hook_schedules)

    def _hook_stage(self) -> None:
        from torch.distributed.pipelining.stage import _PipelineStageBase

        for name in _STAGE_CALLS:
            original = getattr(_PipelineStageBase, name, None)
            if original is not None and not getattr(original, "_accelkit_timed", False):
                setattr(_PipelineStageBase, name, self._timed_stage_call(original, name == "forward_one_chunk"))

    def _hook_schedules(self) -> None:
        from torch.distributed.pipelining import schedules

        for class_name in _SCHEDULES:
            owner = getattr(schedules, class_name, None)
            original = getattr(owner, "step", None)
            if original is not None and not getattr(original, "_accelkit_timed", False):
                owner.step = self._timed_schedule_step(original)

    def _timed_stage_call(self, original, forward: bool):
        clock = self

        @functools.wraps(original)
        def call(stage, *args, **kwargs):
            started = time.perf_counter()
            try:
                out = original(stage, *args, **kwargs)
            finally:
                clock.busy += time.perf_counter() - started
            if forward:
                clock.stages[int(stage.stage_index)] = int(stage.num_stages)
                if clock.boundary is None and not stage.is_last:
                    clock.boundary = _boundary(stage, out)
            return out

        call._accelkit_timed = True  # type: ignore[attr-defined]
        return call

    def _timed_schedule_step(self, original):
        clock = self

        @functools.wraps(original)
        def step(schedule, *args, **kwargs):
            clock._depth += 1
            started = time.perf_counter()
            try:
                return original(schedule, *args, **kwargs)
            finally:
                clock._depth -= 1
                if clock._depth == 0:  # a subclass's step calling its parent's is one step
                    clock.schedule += time.perf_counter() - started
                    clock.microbatches = int(getattr(schedule, "_n_microbatches", 0)) or None
                    clock.schedule_name = type(schedule).__name__

        step._accelkit_timed = True  # type: ignore[attr-defined]
        return step


def _boundary(stage, out) -> dict[str, Any] | None:
    """One micro-batch's output of a stage that sends it on: its rows and tokens, the model's hidden size (from
    the stage module's config when it has one, else the tensor's last dimension) and its element size."""
    tensor = out[0] if isinstance(out, (tuple, list)) and out else out
    shape = getattr(tensor, "shape", None)
    if shape is None or len(shape) < 2:
        return None
    config = getattr(getattr(stage, "submod", None), "config", None)
    hidden = int(getattr(config, "hidden_size", 0) or shape[-1])
    return {"rows": int(shape[0]), "tokens": int(shape[1]) if len(shape) > 2 else 1, "hidden": hidden,
            "element_bytes": int(tensor.element_size())}
