"""A per-rank probe for benchmarks/plan_accuracy.py's pipeline rows: the peak bytes of activations alive at once
during the first step of a torch.distributed.pipelining schedule, written to $ACCELKIT_PROBE_DIR/pp_activations.rank<R>
.json with the pipeline stages the rank runs (from $ACCELKIT_PIPELINE).

Two kinds of tensors count, each storage once, over time:
- what autograd saves for the backward (as accelkit.plan.activations.count counts it: parameters, views of them and
  their casts excluded): every saved tensor is wrapped when autograd packs it, and its bytes leave the running total
  when autograd frees the last wrapper of its storage (the backward of its microbatch ran);
- the stage's outputs torch caches for the backward: `forward_one_chunk` keeps each micro-batch's output in the
  stage's `fwd_cache` until `backward_one_chunk` of that micro-batch pops it (torch's pipelining/stage.py), the
  hidden state a stage sends on, the last stage's logits; they enter the total when the forward returns and leave it
  when that micro-batch's backward returns.
`peak` is the most of both alive at once (what the schedule keeps in flight, not the sum over the step), `peak_saved`
the most of the saved tensors alone.
"""

from __future__ import annotations

import functools
import os


class _Live:
    """The running totals of storages alive (saved for the backward, or cached stage outputs), and their peaks."""

    def __init__(self, count) -> None:
        self._count = count  # accelkit.plan.activations.count
        # storage identity -> [saved wrappers alive, cached wrappers alive, bytes, the storage]
        self.refs: dict[int, list] = {}
        self.live = self.peak = self.packed = 0
        self.live_saved = self.peak_saved = 0

    def pack(self, tensor):
        return self._wrap(tensor, 0)

    def cache(self, tensor):
        """A stage output torch keeps until its micro-batch's backward: counted as held while the wrapper lives."""
        return self._wrap(tensor, 1)

    def _wrap(self, tensor, kind: int):
        if self._count.parameter_link(tensor) is not None:
            return tensor
        storage = self._count.storage_of(tensor)
        if storage is None:
            return tensor
        entry = self.refs.get(storage._cdata)
        if entry is None:
            entry = self.refs[storage._cdata] = [0, 0, storage.nbytes(), storage]
            self.live += entry[2]
            self.packed += entry[2] if kind == 0 else 0
            self.peak = max(self.peak, self.live)
        if kind == 0 and entry[0] == 0:
            self.live_saved += entry[2]
            self.peak_saved = max(self.peak_saved, self.live_saved)
        entry[kind] += 1
        # detached: holding the tensor with its grad_fn would make a node that saves its own output (softmax,
        # attention) a reference cycle that outlives a graph no backward frees (pipelining's shape inference)
        return _Saved(self, storage._cdata, tensor.detach(), kind)

    def release(self, key: int, kind: int = 0) -> None:
        entry = self.refs[key]
        entry[kind] -= 1
        if kind == 0 and entry[0] == 0:
            self.live_saved -= entry[2]
        if entry[0] == 0 and entry[1] == 0:
            self.live -= entry[2]
            del self.refs[key]


class _Saved:
    """One saved tensor as autograd stores it (or one cached stage output); dropping it (autograd frees the node's
    saved tensors once its backward ran) releases its storage's share."""

    __slots__ = ("_live", "_key", "_kind", "tensor")

    def __init__(self, live: _Live, key: int, tensor, kind: int = 0) -> None:
        self._live, self._key, self.tensor, self._kind = live, key, tensor, kind

    def __del__(self) -> None:
        self._live.release(self._key, self._kind)


def _unpack(value):
    return value.tensor if isinstance(value, _Saved) else value


def _tensors(value):
    import torch

    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)


def _chunk_id(args, kwargs, name: str) -> int:
    return kwargs[name] if name in kwargs else args[0]


def install() -> None:
    from accelkit.ranks.probes import after_import, write_rank_result

    # live: the step's tracker while the first step runs; cached: (stage, micro-batch) -> its output's wrappers
    state = {"done": False, "inside": False, "live": None, "cached": {}}

    def wrap(owner) -> None:
        original = owner.step

        @functools.wraps(original)  # the step keeps its signature: the template reads which keywords it takes
        def step(self, *args, **kwargs):
            if state["done"] or state["inside"]:  # the first step only; a subclass calling its base counts once
                return original(self, *args, **kwargs)
            import torch

            from accelkit.plan.activations import count

            live = state["live"] = _Live(count)
            state["inside"] = True
            try:
                with torch.autograd.graph.saved_tensors_hooks(live.pack, _unpack):
                    result = original(self, *args, **kwargs)
            finally:
                state["inside"], state["live"] = False, None
                state["cached"].clear()
            state["done"] = True
            # what the last stage still holds of its outputs (logits) when the step returns: torch keeps every
            # micro-batch's in output_chunks to merge them unless step() is given return_outputs=False
            stages = getattr(self, "_stages", None) or [self._stage]
            held = {s._cdata: s for stage in stages for t in _tensors(stage.output_chunks)
                    if (s := count.storage_of(t)) is not None}
            write_rank_result("pp_activations", {
                "rank": int(os.environ.get("RANK", "0")), "pipeline": os.environ.get("ACCELKIT_PIPELINE", ""),
                "schedule": type(self).__name__, "microbatches": self._n_microbatches, "peak": live.peak,
                "peak_saved": live.peak_saved, "packed": live.packed,
                "left": live.live,  # left: 0 once every backward ran
                "outputs_held": sum(s.nbytes() for s in held.values())})
            return result

        owner.step = step

    def wrap_stage(stage_class) -> None:
        forward, backward = stage_class.forward_one_chunk, stage_class.backward_one_chunk

        @functools.wraps(forward)
        def forward_one_chunk(self, *args, **kwargs):
            result = forward(self, *args, **kwargs)
            live = state["live"]
            if live is not None:  # the stage's output, cached in fwd_cache until this micro-batch's backward
                chunk = _chunk_id(args, kwargs, "fwd_chunk_id")
                output = self.fwd_cache.get(chunk, (None,))[0]
                state["cached"][(id(self), chunk)] = [live.cache(t) for t in _tensors(output)]
            return result

        @functools.wraps(backward)
        def backward_one_chunk(self, *args, **kwargs):
            try:
                return backward(self, *args, **kwargs)
            finally:  # fwd_cache gave the output up at the start; it stays alive until the backward returns
                state["cached"].pop((id(self), _chunk_id(args, kwargs, "bwd_chunk_id")), None)

        stage_class.forward_one_chunk, stage_class.backward_one_chunk = forward_one_chunk, backward_one_chunk

    def hook() -> None:
        from torch.distributed.pipelining import schedules, stage

        for owner in (schedules.PipelineScheduleSingle, schedules.PipelineScheduleMulti):
            wrap(owner)
        wrap_stage(stage._PipelineStageBase)

    after_import("torch.distributed.pipelining.schedules", hook)
