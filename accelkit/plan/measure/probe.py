"""The per-rank probe of `accelkit plan --measure` (ACCELKIT_PROBES=accelkit.plan.measure.probe).

In every rank, around the user's unmodified script:
- the first forward of each prepared model runs under the ActivationCounter (what it keeps for the backward, and
  the outputs it returns), until its backward starts;
- when each backward ends (before DeepSpeed's epilogue reduces anything), the gradients held are counted: the
  peak the step consumes (ZeRO-1 still has every full gradient then);
- after each optimizer step: parameters, optimizer states and DeepSpeed's buffers, and on GPUs the allocator's
  peak (`torch.cuda.max_memory_allocated`);
then each rank writes $ACCELKIT_PROBE_DIR/plan.rank<R>.json. With $ACCELKIT_PROBE_MAX_STEPS=1 (what --measure sets)
the step clock stops every rank cleanly after the first step.
"""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from typing import Any

from accelkit.ranks.probes import after_import, clock, write_rank_result

PROBE_NAME = "plan"


class PlanProbe:
    def __init__(self) -> None:
        self._models: list[Any] = []  # weak references to prepared models
        self._optimizers: list[Any] = []  # weak references to prepared optimizers
        self.records: list[dict[str, Any]] = []
        self.gradients: dict[int, int] = {}  # key(model) -> most gradient bytes held (backward end or before step)
        self.buffers: dict[int, int] = {}  # key(model) -> most buffer bytes seen (reduce buckets)
        self.activations: dict[int, dict[str, int]] = {}  # key(model) -> its first forward's counts
        self.inputs: dict[int, dict[str, Any]] = {}  # key(model) -> its first forward's input shapes
        self._counting: tuple[Any, Any] | None = None  # (model, counter) between a forward and its backward
        self._wrapped: set[int] = set()
        # A number per model that is never reused: id() is, once a model measured earlier has been freed, and the
        # next model would then pass for it (skipped, or credited with the other's counts).
        self._keys: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._numbers = itertools.count(1)

    def key(self, model: Any) -> int:
        if model not in self._keys:
            self._keys[model] = next(self._numbers)
        return self._keys[model]

    # -- finding the models --------------------------------------------------------------------------------------
    def _hook_accelerate(self) -> None:
        from accelerate.accelerator import Accelerator

        original_prepare = Accelerator.prepare
        probe = self

        def prepare(self, *args, **kwargs):
            result = original_prepare(self, *args, **kwargs)
            probe._prepared(tuple(result) if isinstance(result, (tuple, list)) else (result,))
            return result

        Accelerator.prepare = prepare

    def _prepared(self, objects: tuple) -> None:
        """Remember (weakly: a freed model must be freed) every model and optimizer `prepare` returned."""
        import weakref

        import torch

        for obj in objects:
            if isinstance(obj, torch.nn.Module):
                self._models.append(weakref.ref(obj))
                self._watch(obj)
            elif hasattr(obj, "step") and hasattr(obj, "param_groups"):
                self._optimizers.append(weakref.ref(obj))

    def _pairs(self):
        """(model, optimizer) of each prepared model still alive: DeepSpeed's engine owns its optimizer, otherwise
        the optimizer is the one stepping the model's parameters."""
        from accelkit.plan.measure.holdings import inner_optimizer, unwrap_engine

        optimizers = [o for ref in self._optimizers if (o := ref()) is not None]
        for ref in self._models:
            model = ref()
            if model is None:
                continue
            if type(model).__name__ == "DeepSpeedEngine":
                yield model, model.optimizer
                continue
            params = {id(p) for p in unwrap_engine(model)[0].parameters()}
            for optimizer in optimizers:
                if any(id(p) in params for g in inner_optimizer(optimizer).param_groups for p in g["params"]):
                    yield model, optimizer
                    break

    # -- activations: the first forward of each prepared model ---------------------------------------------------
    def _watch(self, model) -> None:
        if self.key(model) in self._wrapped:
            return
        self._wrapped.add(self.key(model))
        from accelkit.plan.activations.count import ActivationCounter, is_checkpointed
        from accelkit.plan.activations.trace import layer_types
        from accelkit.plan.measure.holdings import unwrap_engine

        probe, module = self, unwrap_engine(model)[0]

        def before(mod, args, kwargs):
            if probe.key(model) not in probe.activations and probe._counting is None and mod.training:
                counter = ActivationCounter(module, layer_types(module))
                counter.__enter__()
                probe._counting = (model, counter)
                probe.inputs[probe.key(model)] = {
                    "shapes": {str(k): list(v.shape) for k, v in [*enumerate(args), *kwargs.items()]
                               if hasattr(v, "shape")},
                    "checkpointed": any(is_checkpointed(m) for m in module.modules())}

        def after(mod, args, kwargs, output):
            if probe._counting is not None and probe._counting[0] is model:
                probe._counting[1].hold(output)

        model.register_forward_pre_hook(before, with_kwargs=True)
        model.register_forward_hook(after, with_kwargs=True)

    def _end_counting(self) -> None:
        if self._counting is None:
            return
        model, counter = self._counting
        self._counting = None
        counter.__exit__(None, None, None)
        result = counter.result()
        counter.release()
        self.activations[self.key(model)] = {"saved": result.saved, "outputs": result.outputs,
                                       "weight_copies": result.weight_copies, "total": result.total}

    # -- gradients: when each backward ends -----------------------------------------------------------------------
    def _hook_backward(self) -> None:
        import sys

        autograd = sys.modules["torch.autograd"]  # torch itself may still be importing
        original = autograd.backward
        probe = self

        def backward(*args, **kwargs):
            probe._end_counting()
            result = original(*args, **kwargs)
            probe._count_gradients()
            return result

        backward.__wrapped__ = original
        autograd.backward = backward

    def _count_gradients(self, event=None) -> None:
        """Gradients peak either when the backward ends (ZeRO-1: every full gradient, before its reduction) or
        just before the step (ZeRO-2: the partition buffer, once the last bucket was reduced): keep the larger."""
        from accelkit.plan.measure.holdings import buffer_storages, gradient_bytes, inner_optimizer, unwrap_engine

        for model, optimizer in self._pairs():
            if any(r["model_id"] == self.key(model) for r in self.records):
                continue
            inner = inner_optimizer(optimizer)
            held = gradient_bytes(unwrap_engine(model)[0], inner)
            self.gradients[self.key(model)] = max(held, self.gradients.get(self.key(model), 0))
            buffers = buffer_storages(inner).total
            self.buffers[self.key(model)] = max(buffers, self.buffers.get(self.key(model), 0))

    # -- after a step ------------------------------------------------------------------------------------------------
    def _after_step(self, event) -> None:
        from accelkit.plan.measure import holdings

        stepped = holdings.inner_optimizer(event.optimizer)
        for model, optimizer in self._pairs():
            inner = holdings.inner_optimizer(optimizer)
            if inner is not stepped or any(r["model_id"] == self.key(model) for r in self.records):
                continue
            module = holdings.unwrap_engine(model)[0]
            record = {
                "model_id": self.key(model), "step": event.clock_steps, **holdings.backend_facts(model, optimizer),
                "parameters": holdings.parameter_storages(module, inner).total,
                "gradients": self.gradients.get(self.key(model)),
                "optimizer": holdings.optimizer_bytes(inner),
                "buffers": max(holdings.buffer_storages(inner).total, self.buffers.get(self.key(model), 0)),
                "activations": self.activations.get(self.key(model)),
                "inputs": self.inputs.get(self.key(model)),
                "shapes": holdings.full_shapes(module),
                "groups": holdings.group_names(module, inner),
                "world_size": int(os.environ.get("WORLD_SIZE", "1")),
                "rank": int(os.environ.get("RANK", "0")),
            }
            if record.get("ddp_bucket_bytes"):
                record["buffers"] = record["ddp_bucket_bytes"]
            record.update(_cuda_peak())
            self.records.append(record)

    def finish(self, reason: str) -> None:
        write_rank_result(PROBE_NAME, {"reason": reason, "records": self.records})

    def install(self) -> None:
        after_import("accelerate.accelerator", self._hook_accelerate)
        after_import("torch.autograd", self._hook_backward)
        steps = clock()
        steps.on_before_step(self._count_gradients)
        steps.on_step(self._after_step)
        steps.on_finish(self.finish)
        steps.install()


def _cuda_peak() -> dict[str, int]:
    """On GPUs, the allocator's view: the peak since start and what is allocated after the step."""
    import torch

    if not torch.cuda.is_available():
        return {}
    return {"cuda_max_allocated": int(torch.cuda.max_memory_allocated()),
            "cuda_allocated": int(torch.cuda.memory_allocated())}


@functools.cache  # one probe per rank, however often the bootstrap asks
def install() -> PlanProbe:
    probe = PlanProbe()
    probe.install()
    return probe
