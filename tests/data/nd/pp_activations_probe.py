"""A per-rank probe for benchmarks/plan_accuracy.py's pipeline rows: the peak bytes of tensors autograd saved for the
backward that are alive at once during the first step of a torch.distributed.pipelining schedule, written to
$ACCELKIT_PROBE_DIR/pp_activations.rank<R>.json with the pipeline stages the rank runs (from $ACCELKIT_PIPELINE).

What counts is what accelkit.plan.activations.count counts as saved (each storage once; parameters, views of them
and their casts excluded), but over time: every saved tensor is wrapped when autograd packs it, and its bytes leave
the running total when autograd frees the last wrapper of its storage (the backward of its microbatch ran), so the
peak is what the schedule keeps in flight, not the sum over the step.
"""

from __future__ import annotations

import functools
import os


class _Live:
    """The running total of saved storages alive, and its peak."""

    def __init__(self, count) -> None:
        self._count = count  # accelkit.plan.activations.count
        self.refs: dict[int, list] = {}  # storage identity -> [wrappers alive, bytes, the storage]
        self.live = self.peak = self.packed = 0

    def pack(self, tensor):
        if self._count.parameter_link(tensor) is not None:
            return tensor
        storage = self._count.storage_of(tensor)
        if storage is None:
            return tensor
        entry = self.refs.get(storage._cdata)
        if entry is None:
            entry = self.refs[storage._cdata] = [0, storage.nbytes(), storage]
            self.live += entry[1]
            self.packed += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        # detached: holding the tensor with its grad_fn would make a node that saves its own output (softmax,
        # attention) a reference cycle that outlives a graph no backward frees (pipelining's shape inference)
        return _Saved(self, storage._cdata, tensor.detach())

    def release(self, key: int) -> None:
        entry = self.refs[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[key]


class _Saved:
    """One saved tensor as autograd stores it; dropping it (autograd frees the node's saved tensors once its
    backward ran) releases its storage's share."""

    __slots__ = ("_live", "_key", "tensor")

    def __init__(self, live: _Live, key: int, tensor) -> None:
        self._live, self._key, self.tensor = live, key, tensor

    def __del__(self) -> None:
        self._live.release(self._key)


def _unpack(value):
    return value.tensor if isinstance(value, _Saved) else value


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def install() -> None:
    from accelkit.ranks.probes import after_import, write_rank_result

    state = {"done": False, "inside": False}

    def wrap(owner) -> None:
        original = owner.step

        @functools.wraps(original)  # the step keeps its signature: the template reads which keywords it takes
        def step(self, *args, **kwargs):
            if state["done"] or state["inside"]:  # the first step only; a subclass calling its base counts once
                return original(self, *args, **kwargs)
            import torch

            from accelkit.plan.activations import count

            live = _Live(count)
            state["inside"] = True
            try:
                with torch.autograd.graph.saved_tensors_hooks(live.pack, _unpack):
                    result = original(self, *args, **kwargs)
            finally:
                state["inside"] = False
            state["done"] = True
            # what the last stage still holds of its outputs (logits) when the step returns: torch keeps every
            # micro-batch's in output_chunks to merge them unless step() is given return_outputs=False
            stages = getattr(self, "_stages", None) or [self._stage]
            held = {s._cdata: s for stage in stages for t in _tensors(stage.output_chunks)
                    if (s := count.storage_of(t)) is not None}
            write_rank_result("pp_activations", {
                "rank": int(os.environ.get("RANK", "0")), "pipeline": os.environ.get("ACCELKIT_PIPELINE", ""),
                "schedule": type(self).__name__, "microbatches": self._n_microbatches, "peak": live.peak,
                "packed": live.packed, "left": live.live,  # left: 0 once every backward ran
                "outputs_held": sum(s.nbytes() for s in held.values())})
            return result

        owner.step = step

    def hook() -> None:
        from torch.distributed.pipelining import schedules

        for owner in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
            wrap(owner)

    after_import("torch.distributed.pipelining.schedules", hook)
