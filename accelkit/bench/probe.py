"""The bench probe, installed in every rank before the user's unmodified script (ACCELKIT_PROBES=accelkit.bench.probe).

Per real optimizer step (the shared step clock: plain torch, Accelerate with accumulation, DeepSpeed engines) it
records the step's wall time (from the end of the previous step to the end of this one, so the steps of a run add
up to its wall time), the part of it spent blocked on data loaders, and the samples and tokens of the training
loader's batches that went into it. At the end it adds the rank's peak memory (`torch.cuda.max_memory_allocated`
on GPUs, peak RSS on CPU), the model's gradient bytes, and the error that ended the script if one did, and writes
$ACCELKIT_PROBE_DIR/bench.rank<R>.json. The step limit stops every rank cleanly with exit 0: $ACCELKIT_PROBE_MAX_STEPS
= warmup + the minimum steps, raised at checkpoints until the measured window holds $ACCELKIT_BENCH_MIN_TIME seconds
(accelkit.bench.window). The last warmup step runs under a collective counter (accelkit.bench.comm_count): the
bytes a step moves, by collective and group size (a pipeline's sends and receives among them). In a rank that runs
a torch.distributed.pipelining schedule, each step also records its stage's busy and schedule time
(accelkit.bench.stage_clock), and the result its stages and boundary tensor.

Which loader trains: the one that yielded the last batch before a step (an evaluation loader iterated between two
steps adds to the step's data wait, never to its samples).
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from accelkit.bench import MIN_TIME_ENV, PROBE_NAME, WARMUP_ENV
from accelkit.bench.loaders import BatchSize, LoaderHooks
from accelkit.bench.stage_clock import StageClock
from accelkit.bench.sync_wait import SyncWaitClock
from accelkit.bench.window import agree_seconds, next_checkpoint
from accelkit.errors import clip
from accelkit.ranks.probes import MAX_STEPS_ENV, StepEvent, clock, write_rank_result


class StepRecorder:
    """Accumulates loader fetches between clock steps and closes one step record per clock step."""

    def __init__(self, sync_at: tuple[int, ...] = (), *, warmup: int = 0, min_steps: int = 0, min_time: float = 0.0,
                 set_limit=None, count_comm: bool = False, stage_clock: StageClock | None = None,
                 sync_wait: SyncWaitClock | None = None) -> None:
        self.sync_at = sync_at  # clock steps after which CUDA is synchronised (end of warmup, last measured step)
        self.warmup = warmup
        self.min_steps = min_steps
        self.min_time = min_time
        self.set_limit = set_limit  # moves the step clock's limit (the window grows at checkpoints)
        self.checkpoint = warmup + min_steps if min_time > 0 and min_steps > 0 else None
        self.window = "steps" if self.checkpoint is None else "time"
        self.count_comm = count_comm and warmup >= 2  # count the last warmup step; its predecessor starts it
        self.comm: dict[str, dict[str, int]] | None = None
        self.stage_clock = stage_clock
        self.sync_wait = sync_wait
        self._counter = None
        self.steps: list[dict[str, Any]] = []
        self.error: str | None = None
        self.gradient_bytes: int | None = None
        self.distributed: dict[str, Any] = {}
        self.other_samples = 0  # batches of loaders that did not train (evaluation)
        self.overhead_seconds = 0.0
        self._interval_start: float | None = None
        self._wait = 0.0
        self._optimizer = 0.0  # seconds inside optimizer steps (every optimizer's) since the last clock step
        self._per_loader: dict[int, list[int]] = {}  # loader id -> [samples, tokens] since the last step
        self._last_loader: int | None = None

    # -- loader side -----------------------------------------------------------------------------------------
    def on_fetch(self, loader_id: int, started: float, finished: float, size: BatchSize) -> None:
        if self._interval_start is None:  # the first step starts when the loop first asks for data
            self._interval_start = started
        self._wait += finished - started
        counts = self._per_loader.setdefault(loader_id, [0, 0])
        counts[0] += size.samples
        counts[1] += size.tokens
        self._last_loader = loader_id

    # -- clock side ------------------------------------------------------------------------------------------
    def on_step(self, event: StepEvent) -> None:
        self._optimizer += event.finished - event.started
        if not event.is_clock:
            return
        finished = event.finished
        if self._counter is not None and event.clock_steps == self.warmup:
            self.comm = self._counter.stop()
            self._counter = None
        if (event.clock_steps in self.sync_at or event.clock_steps == self.checkpoint) and _cuda_in_use():
            # GPU work is asynchronous: wait for it at the edges of the measured window (only there), so the
            # window holds exactly the measured steps' GPU work.
            import torch

            torch.cuda.synchronize()
            finished = time.perf_counter()
        entered = time.perf_counter()
        if self.gradient_bytes is None:
            self.gradient_bytes, self.distributed = model_facts(event)
            if self.sync_wait is not None:
                self.sync_wait.watch(stepped_parameters(event))
        start = self._interval_start if self._interval_start is not None else event.started
        train = self._per_loader.pop(self._last_loader, [0, 0]) if self._last_loader is not None else [0, 0]
        self.other_samples += sum(counts[0] for counts in self._per_loader.values())
        seconds = finished - start
        data_wait = min(self._wait, seconds)
        optimizer = min(self._optimizer, seconds - data_wait)
        sync_wait = self.sync_wait.close_step() if self.sync_wait is not None else None
        record = {"step": event.clock_steps, "seconds": seconds, "data_wait_s": data_wait, "optimizer_s": optimizer,
                  "sync_wait_s": None if sync_wait is None else min(sync_wait, seconds - data_wait - optimizer),
                  "samples": train[0], "tokens": train[1]}
        pipeline = self.stage_clock.close_step() if self.stage_clock is not None else None
        if pipeline is not None:
            record["pipeline"] = pipeline
        self.steps.append(record)
        self._interval_start = finished
        self._wait = self._optimizer = 0.0
        self._per_loader = {}
        self._last_loader = None
        if event.clock_steps == self.checkpoint:
            self._decide()
            self._interval_start = time.perf_counter()  # the agreement is the probe's time, not the next step's
        if self.count_comm and event.clock_steps == self.warmup - 1 and not _compiled_graphs():
            from accelkit.bench.comm_count import CommCounter

            self._counter = CommCounter()
            self._counter.start()
            self._interval_start = time.perf_counter()
        self.overhead_seconds += time.perf_counter() - entered

    def _decide(self) -> None:
        """At a checkpoint: stop after this step, or move the limit so the window reaches --min-time."""
        measured = self.steps[self.warmup:]
        agreed = agree_seconds(sum(step["seconds"] for step in measured))
        if agreed is None:  # no process group to agree through: the minimum steps are the window
            self.window, self.checkpoint = "steps (the ranks had no process group to agree on a time window)", None
            return
        target = next_checkpoint(len(measured), agreed, self.min_time, self.min_steps)
        self.checkpoint = None if target is None else self.warmup + target
        if self.checkpoint is not None and self.set_limit is not None:
            self.set_limit(self.checkpoint)

    def result(self, reason: str, loader_seconds: float) -> dict[str, Any]:
        return {
            "rank": int(os.environ.get("RANK", "0")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")),
            "pid": os.getpid(),
            "reason": reason,
            "error": self.error,
            "steps": self.steps,
            "other_samples": self.other_samples,
            "window": self.window,
            "min_time_s": self.min_time,
            "comm_per_step": self.comm,
            "pipeline": self.stage_clock.facts() if self.stage_clock is not None else None,
            "gradient_bytes": self.gradient_bytes,
            "gpu_async": _cuda_in_use(),  # host-clock phases then miss what the GPU streams wait for (stragglers)
            **self.distributed,
            **peak_memory(),
            "probe_overhead_s": self.overhead_seconds + loader_seconds,
        }


def model_facts(event: StepEvent) -> tuple[int | None, dict[str, Any]]:
    """Gradient bytes of the model being stepped (global sizes: DTensor shapes are global, ZeRO-3 keeps ds_numel)
    and what the distributed setup is, as far as the stepping object tells."""
    facts: dict[str, Any] = {"step_source": event.source}
    if event.source == "deepspeed":
        facts["zero_stage"] = int(event.optimizer.zero_optimization_stage())
    params = stepped_parameters(event)
    if "accelerate" in sys.modules:
        from accelerate.state import PartialState

        if PartialState._shared_state:
            facts["distributed_type"] = str(PartialState().distributed_type.value)
    if not params:
        return None, facts
    total = sum(int(getattr(p, "ds_numel", p.numel())) * p.element_size() for p in params)
    return total, facts


def stepped_parameters(event: StepEvent) -> list:
    """The trainable parameters the stepping object updates (a DeepSpeed engine's module's, else the optimizer's)."""
    stepper = event.optimizer
    if event.source == "deepspeed":
        return [p for p in stepper.module.parameters() if p.requires_grad]
    inner = getattr(stepper, "optimizer", stepper)  # Accelerate's AcceleratedOptimizer wraps the torch one
    return [p for group in getattr(inner, "param_groups", ()) for p in group["params"] if p.requires_grad]


def _compiled_graphs() -> bool:
    """Whether torch.compile has compiled anything: a dispatch mode entered around a compiled step would make it
    recompile (or fall back), changing what is measured, so the collectives are then not counted."""
    dynamo = sys.modules.get("torch._dynamo.utils")
    try:
        return bool(dynamo and dynamo.counters["stats"]["unique_graphs"])
    except (AttributeError, KeyError, TypeError):
        return False


def _cuda_in_use() -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized()


def peak_memory() -> dict[str, Any]:
    if _cuda_in_use():
        import torch

        return {"peak_memory_bytes": int(torch.cuda.max_memory_allocated()), "memory_kind": "cuda max allocated"}
    # ru_maxrss is in KiB on Linux: the high-water mark of the process's resident set.
    return {"peak_memory_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,
            "memory_kind": "peak RSS"}


_RECORDER: StepRecorder | None = None


def install() -> None:
    """Probe entry point: hook loaders and the step clock; write this rank's result when the run ends."""
    global _RECORDER
    if _RECORDER is not None:
        return
    warmup = int(os.environ.get(WARMUP_ENV, "0"))
    limit = int(os.environ.get(MAX_STEPS_ENV, "0"))
    min_time = float(os.environ.get(MIN_TIME_ENV, "0") or 0)
    step_clock = clock()

    def set_limit(steps: int) -> None:
        step_clock.max_steps = steps

    stage_clock = StageClock()
    stage_clock.install()
    sync_wait = SyncWaitClock()
    sync_wait.install()
    recorder = _RECORDER = StepRecorder(sync_at=tuple(n for n in (warmup, limit) if n > 0), warmup=warmup,
                                        min_steps=max(0, limit - warmup), min_time=min_time, set_limit=set_limit,
                                        count_comm=True, stage_clock=stage_clock, sync_wait=sync_wait)
    loaders = LoaderHooks(recorder.on_fetch)
    loaders.install()
    step_clock.on_step(recorder.on_step)
    step_clock.on_finish(lambda reason: write_rank_result(
        PROBE_NAME, recorder.result("error" if recorder.error else reason, loaders.counting_seconds)))

    previous_hook = sys.excepthook

    def record_error(kind, value, traceback) -> None:  # the script's uncaught exception ends the run
        recorder.error = clip(f"{kind.__name__}: {value}", 500)
        step_clock.finish("error")
        previous_hook(kind, value, traceback)

    sys.excepthook = record_error
    step_clock.install()
