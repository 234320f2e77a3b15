"""One clock for "an optimizer step happened", whatever the script trains with, and a clean stop after N steps.

Where a step really updates weights depends on the stack, so three layers are hooked and the outermost one wins:
- DeepSpeed: `DeepSpeedEngine.step` (Accelerate calls it inside `accelerator.backward`); a step counts when it is
  a gradient-accumulation boundary. ZeRO's inner per-parameter-group `optimizer.step()` calls are not counted.
- Accelerate: `AcceleratedOptimizer.step`; a step counts when `sync_gradients` is set (not during accumulation).
  DeepSpeed's wrapper (`DeepSpeedOptimizerWrapper.step`, a no-op) is left to the engine layer.
- plain torch: the global optimizer step hooks (`torch.optim.optimizer.register_optimizer_step_{pre,post}_hook`),
  ignored while one of the layers above is running.

The first optimizer that steps is the clock (a GAN's discriminator, say); every step of every optimizer is
reported to the callbacks, each with the clock's step count. `on_before_step` callbacks run just before a counted
step calls the optimizer (gradients are complete then, and not yet consumed or freed, e.g. by ZeRO). With a step
limit, every rank stops when the clock is about to take step N+1: data-parallel ranks step in lockstep, so they
all stop at the same point, after the same collectives; the stop is a SystemExit(0) raised from the hook (the
script's `finally` blocks run), after the finish callbacks have written their results.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from accelkit.ranks.probes import MAX_STEPS_ENV
from accelkit.ranks.probes.imports import after_import

EXIT_GRACE_SECONDS = 60.0  # after a stop, force the exit if interpreter shutdown hangs (e.g. loader workers)


@dataclass(frozen=True)
class BeforeStep:
    clock_steps: int  # steps the clock optimizer has completed before this one
    is_clock: bool  # False for a second optimizer before the clock is known, too
    source: str  # "deepspeed" | "accelerate" | "torch"
    optimizer: object


@dataclass(frozen=True)
class StepEvent:
    clock_steps: int  # steps the clock optimizer has completed, this one included when `is_clock`
    is_clock: bool
    started: float  # time.perf_counter() when the step call began
    finished: float
    source: str  # "deepspeed" | "accelerate" | "torch"
    optimizer: object


class StepClock:
    """Counts real optimizer steps and calls back; one per process (see `clock()`)."""

    def __init__(self) -> None:
        self.step_callbacks: list[Callable[[StepEvent], None]] = []
        self.before_step_callbacks: list[Callable[[BeforeStep], None]] = []
        self.finish_callbacks: list[Callable[[str], None]] = []
        self.max_steps: int | None = None
        self.clock_steps = 0
        self._clock_id: int | None = None
        self._depth = threading.local()
        self._finished = False
        self._installed = False

    # -- what probes use -------------------------------------------------------------------------------------
    def on_step(self, callback: Callable[[StepEvent], None]) -> None:
        self.step_callbacks.append(callback)

    def on_before_step(self, callback: Callable[[BeforeStep], None]) -> None:
        """`callback(BeforeStep)` runs right before each counted optimizer step (after the step-limit check)."""
        self.before_step_callbacks.append(callback)

    def on_finish(self, callback: Callable[[str], None]) -> None:
        """`callback(reason)` runs once: at the step limit ("step limit") or when the script ends ("script end")."""
        self.finish_callbacks.append(callback)

    def install(self, max_steps: int | None = None) -> None:
        if max_steps is None and os.environ.get(MAX_STEPS_ENV):
            max_steps = int(os.environ[MAX_STEPS_ENV])
        if max_steps is not None:
            self.max_steps = max_steps if self.max_steps is None else min(self.max_steps, max_steps)
        if self._installed:
            return
        self._installed = True
        atexit.register(self.finish, "script end")
        after_import("torch.optim.optimizer", self._hook_torch)
        after_import("accelerate.optimizer", self._hook_accelerate)
        after_import("deepspeed.runtime.engine", self._hook_deepspeed)

    def finish(self, reason: str) -> None:
        if self._finished:
            return
        self._finished = True
        for callback in self.finish_callbacks:
            callback(reason)

    # -- the three layers ------------------------------------------------------------------------------------
    def _inside(self) -> int:
        return getattr(self._depth, "value", 0)

    def _before(self, optimizer: object, source: str) -> float:
        is_clock = self._clock_id is None or self._clock_id == id(optimizer)
        if is_clock and self.max_steps is not None and self.clock_steps >= self.max_steps:
            self._stop()
        if self.before_step_callbacks:
            event = BeforeStep(self.clock_steps, is_clock, source, optimizer)
            for callback in self.before_step_callbacks:
                callback(event)
        return time.perf_counter()

    def _after(self, optimizer: object, started: float, source: str) -> None:
        if self._clock_id is None:
            self._clock_id = id(optimizer)
        is_clock = self._clock_id == id(optimizer)
        if is_clock:
            self.clock_steps += 1
        event = StepEvent(self.clock_steps, is_clock, started, time.perf_counter(), source, optimizer)
        for callback in self.step_callbacks:
            callback(event)

    def _stop(self) -> None:
        self.finish("step limit")
        timer = threading.Timer(EXIT_GRACE_SECONDS, os._exit, args=(0,))
        timer.daemon = True
        timer.start()
        raise SystemExit(0)

    def _wrap(self, owner: type, name: str, source: str, counts: Callable[[object], bool]) -> None:
        original = getattr(owner, name)
        if getattr(original, "_accelkit_clock", False):
            return
        clock = self

        def step(self, *args, **kwargs):
            if clock._inside() or not counts(self):
                clock._depth.value = clock._inside() + 1
                try:
                    return original(self, *args, **kwargs)
                finally:
                    clock._depth.value -= 1
            started = clock._before(self, source)
            clock._depth.value = clock._inside() + 1
            try:
                result = original(self, *args, **kwargs)
            finally:
                clock._depth.value -= 1
            clock._after(self, started, source)
            return result

        step._accelkit_clock = True
        step.__wrapped__ = original
        setattr(owner, name, step)

    def _hook_deepspeed(self) -> None:
        from deepspeed.runtime.engine import DeepSpeedEngine

        self._wrap(DeepSpeedEngine, "step", "deepspeed", lambda engine: engine.is_gradient_accumulation_boundary())

    def _hook_accelerate(self) -> None:
        from accelerate.optimizer import AcceleratedOptimizer

        self._wrap(AcceleratedOptimizer, "step", "accelerate", lambda opt: bool(opt.gradient_state.sync_gradients))

    def _hook_torch(self) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        started: dict[int, float] = {}

        def pre(optimizer, args, kwargs) -> None:
            if not self._inside():
                started[id(optimizer)] = self._before(optimizer, "torch")

        def post(optimizer, args, kwargs) -> None:
            if not self._inside():
                self._after(optimizer, started.pop(id(optimizer), time.perf_counter()), "torch")

        register_optimizer_step_pre_hook(pre)
        register_optimizer_step_post_hook(post)


_CLOCK: StepClock | None = None


def clock() -> StepClock:
    """The process's step clock (created on first use)."""
    global _CLOCK
    if _CLOCK is None:
        _CLOCK = StepClock()
    return _CLOCK


def install() -> None:
    """Probe entry point (ACCELKIT_PROBES=accelkit.ranks.probes.steps): count steps, stop after
    $ACCELKIT_PROBE_MAX_STEPS."""
    clock().install()
