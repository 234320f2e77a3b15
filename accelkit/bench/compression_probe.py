"""A rank probe for gradient compression (ACCELKIT_PROBES=accelkit.bench.compression_probe), around a script.

Per optimizer step it counts the collectives issued inside backward (`torch.autograd.backward`: where DDP's
bucketed all-reduce, its communication hooks and FSDP2's reduce-scatter run; the script's own loss reductions and
logging outside it are not gradient traffic) with accelkit.bench.comm_count, and the loss that backward was called
on. At the end it adds PowerSGD's own compression_stats() (when the run made a PowerSGDState) and a digest of this
rank's parameters (equal on every rank of a data-parallel run whose replicas stayed in sync), and writes
$ACCELKIT_PROBE_DIR/compression.rank<R>.json.
"""

from __future__ import annotations

import hashlib
import sys
import threading
from typing import Any

from accelkit.ranks.probes import after_import, clock, write_rank_result

PROBE_NAME = "compression"
_POWERSGD_MODULE = "torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook"


class CompressionRecorder:
    def __init__(self) -> None:
        self.steps: list[dict[str, Any]] = []
        self.pending: dict[str, dict[str, int]] = {}
        self.losses: list[float] = []
        self.powersgd_states: list[Any] = []
        self.optimizer: Any = None
        self.backward_thread: int | None = None  # the thread running backward, while one runs
        self._lock = threading.Lock()

    def wrap_backward(self) -> None:
        import torch

        from accelkit.bench.comm_count import CommCounter

        original = torch.autograd.backward
        recorder = self

        def backward(tensors, *args, **kwargs):
            if isinstance(tensors, torch.Tensor) and tensors.numel() == 1:
                recorder.losses.append(float(tensors.detach().float()))
            counter = CommCounter()
            recorder.backward_thread = threading.get_ident()
            counter.start()
            try:
                return original(tensors, *args, **kwargs)
            finally:
                recorder.backward_thread = None
                for key, entry in counter.stop().items():
                    recorder.add(key, entry["calls"], entry["bytes"])

        torch.autograd.backward = backward
        self._wrap_python_all_reduce()

    def add(self, key: str, calls: int, size: int) -> None:
        with self._lock:
            into = self.pending.setdefault(key, {"calls": 0, "bytes": 0})
            into["calls"] += calls
            into["bytes"] += size

    def _wrap_python_all_reduce(self) -> None:
        """Communication hooks chain their collectives with Future.then(): on gloo the callbacks (PowerSGD's P and Q
        all-reduces) run on the backend's own threads, which the thread-local dispatch mode does not see. Calls of
        torch.distributed.all_reduce from another thread while a backward is running are counted here instead."""
        import torch.distributed as dist

        from accelkit.bench.comm_count import group_key, group_stride

        original = dist.all_reduce
        recorder = self

        def all_reduce(tensor, *args, **kwargs):
            started_in = recorder.backward_thread
            if started_in is not None and threading.get_ident() != started_in:
                group = kwargs.get("group", args[1] if len(args) > 1 else None)
                size = dist.get_world_size(group)
                stride = 1 if group is None else group_stride(group)
                recorder.add(group_key("all_reduce", (size, stride)), 1, tensor.numel() * tensor.element_size())
            return original(tensor, *args, **kwargs)

        dist.all_reduce = all_reduce

    def watch_powersgd(self) -> None:
        module = sys.modules[_POWERSGD_MODULE]
        original_init = module.PowerSGDState.__init__
        recorder = self

        def init(state, *args, **kwargs):
            original_init(state, *args, **kwargs)
            recorder.powersgd_states.append(state)

        module.PowerSGDState.__init__ = init

    def on_step(self, event: Any) -> None:
        if not event.is_clock:
            return
        self.optimizer = event.optimizer
        loss = sum(self.losses) if self.losses else None
        self.steps.append({"step": event.clock_steps, "comm": self.pending, "loss": loss, "finished": event.finished})
        self.pending, self.losses = {}, []

    def result(self, reason: str) -> dict[str, Any]:
        out: dict[str, Any] = {"reason": reason, "steps": self.steps, "parameters": _parameters(self.optimizer)}
        if self.powersgd_states:
            state = self.powersgd_states[-1]
            rate, before, after = state.compression_stats()
            out["powersgd"] = {"compression_rate": float(rate), "numel_before": int(before),
                               "numel_after": int(after), "iterations": int(state.iter),
                               "start_iter": int(state.start_powerSGD_iter),
                               "rank": int(state.matrix_approximation_rank)}
        return out


def _parameters(optimizer: Any) -> dict[str, Any]:
    """Shapes of the trained parameters (global shapes) and a digest of this rank's local values."""
    inner = getattr(optimizer, "optimizer", optimizer)
    params = [p for group in getattr(inner, "param_groups", ()) for p in group["params"]]
    digest = hashlib.sha256()
    shapes = []
    for p in params:
        local = p.to_local() if hasattr(p, "to_local") else p
        digest.update(local.detach().float().contiguous().cpu().numpy().tobytes())
        shapes.append(list(p.shape))
    return {"shapes": shapes, "digest": digest.hexdigest()}


_RECORDER: CompressionRecorder | None = None


def install() -> None:
    global _RECORDER
    if _RECORDER is not None:
        return
    recorder = _RECORDER = CompressionRecorder()
    after_import("torch", recorder.wrap_backward)
    after_import(_POWERSGD_MODULE, recorder.watch_powersgd)
    step_clock = clock()
    step_clock.on_step(recorder.on_step)
    step_clock.on_finish(lambda reason: write_rank_result(PROBE_NAME, recorder.result(reason)))
    step_clock.install()
