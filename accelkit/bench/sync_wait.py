"""The collective side of the bench probe: how long this rank waits, at the end of each backward pass, for the
other ranks' gradients (DDP's all-reduce), measured on the rank's own clock.

A data-parallel backward launches its gradient all-reduce bucket by bucket as the rank's gradients become ready,
and returns only when every bucket's collective has completed, which needs every rank's contribution. So once this
rank's last gradient is ready (the last parameter's `register_post_accumulate_grad_hook` fires), the rest of the
`torch.autograd.backward` call is the wait for the slowest rank (plus the last bucket's own transfer, which every
rank pays alike):

    sync_wait_s  = sum over the backward calls of a step of (backward returned - this rank's last gradient ready)

A rank that everyone waits for shows almost none; the others show how much longer it took. The hooks go on the
parameters of the optimizer that steps (known at the first step, a warmup step), so from the second step on.
Waits elsewhere are not separated here: in a forward (FSDP's parameter all-gathers, DDP's buffer broadcast), in
hooks that run before the rank's last gradient is complete (FSDP2's per-layer reduce-scatters), or in a library's
own reduction after autograd returns (DeepSpeed's engine).
"""

from __future__ import annotations

import functools
import time


class SyncWaitClock:
    """Accumulates this rank's wait for the gradient sync between two optimizer steps."""

    def __init__(self) -> None:
        self.wait = 0.0
        self.measured = False  # a backward with hooked gradients ran since the last step
        self._last_ready: float | None = None
        self._hooked: set[int] = set()

    def close_step(self) -> float | None:
        """This step's wait (None when no backward of hooked gradients ran), and a fresh start for the next."""
        out = self.wait if self.measured else None
        self.wait, self.measured = 0.0, False
        return out

    # -- hooks ------------------------------------------------------------------------------------------------
    def install(self) -> None:
        from accelkit.ranks.probes import after_import

        after_import("torch.autograd", self._hook_backward)

    def watch(self, params) -> None:
        """Note the time each of `params`' gradients is complete (a post-accumulate-grad hook on each, once)."""
        for param in params:
            if id(param) in self._hooked or not getattr(param, "requires_grad", False) or not param.is_leaf:
                continue
            try:
                param.register_post_accumulate_grad_hook(self._ready)  # for the rest of the run: no handle kept
            except RuntimeError:  # a parameter autograd cannot hook (a library's own flat buffer): not timed
                continue
            self._hooked.add(id(param))

    def _ready(self, _param) -> None:
        self._last_ready = time.perf_counter()

    def _hook_backward(self) -> None:
        import sys

        autograd = sys.modules["torch.autograd"]  # called as its import completes: torch is not bound yet
        original = autograd.backward
        if getattr(original, "_accelkit_sync_wait", False):
            return
        clock = self

        @functools.wraps(original)
        def backward(*args, **kwargs):
            clock._last_ready = None
            started = time.perf_counter()
            out = original(*args, **kwargs)
            ready = clock._last_ready
            if ready is not None:  # only gradients of the stepped parameters tell when the rank's own work ended
                clock.wait += time.perf_counter() - max(ready, started)
                clock.measured = True
            return out

        backward._accelkit_sync_wait = True  # type: ignore[attr-defined]
        autograd.backward = backward
