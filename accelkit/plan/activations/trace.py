"""Trace a model's forward on the meta device and count what it keeps for the backward (see count.py), the way a
given backend runs it (see emulate.py): no weights, no memory, a fraction of a second even for a 70B model.

A `Compute` says how the backend runs the forward: the dtype of the weights it computes with, autocast or not, and
whether Accelerate converts the outputs to float32 (it wraps the forward so when it runs autocast).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from accelkit.plan.activations.count import ActivationCount, ActivationCounter


@dataclass(frozen=True)
class Compute:
    weights: str  # "float32" | "bfloat16" | "float16": the weights the forward computes with
    autocast: str | None  # autocast dtype, None without autocast
    fp32_outputs: bool  # Accelerate's convert_outputs_to_fp32 (applied with its autocast)


@dataclass(frozen=True)
class Trace:
    count: ActivationCount
    checkpointed: bool  # activation checkpointing was applied
    kernels: tuple[tuple[str, int], ...]  # attention kernels used, with how many calls
    recompute: int = 0  # with checkpointing: what one layer keeps while the backward recomputes it

    @property
    def activations(self) -> int:
        """Peak bytes: what the forward keeps, plus one layer's activations while it is recomputed."""
        return self.count.total + self.recompute


def layer_types(model) -> tuple[str, ...]:
    """Class names of the model's repeated layers: what checkpointing wraps and FSDP shards as units."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:  # older transformers
        GradientCheckpointingLayer = ()  # noqa: N806
    found = {type(m).__name__ for m in model.modules() if GradientCheckpointingLayer and
             isinstance(m, GradientCheckpointingLayer)}
    return tuple(sorted(found or set(getattr(model, "_no_split_modules", None) or ())))


def enable_checkpointing(model) -> bool:
    """Checkpoint every layer the way the run would: transformers' own switch (non-reentrant), else torch's
    checkpoint_wrapper around each layer (what Accelerate's FSDP activation checkpointing does)."""
    if getattr(model, "supports_gradient_checkpointing", False):
        # Training keeps no KV cache: off before the forward, or transformers prints its "use_cache=True is
        # incompatible with gradient checkpointing" line into the plan's output.
        config = getattr(model, "config", None)
        if getattr(config, "use_cache", False):
            config.use_cache = False
        # transformers 5 renamed gradient_checkpointing_enable to activation_checkpointing_enable
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable()
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        return True
    names = set(layer_types(model))
    if not names:
        return False
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import apply_activation_checkpointing

    apply_activation_checkpointing(model, check_fn=lambda m: type(m).__name__ in names)
    return True


@contextlib.contextmanager
def _unpacked_sequences():
    """transformers looks at position ids to detect packed sequences (a data-dependent check meta tensors cannot
    answer); the trace is of ordinary, unpacked batches."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return
    original = getattr(masking_utils, "find_packed_sequence_indices", None)
    if original is None:
        yield
        return
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = original


def trace(spec, compute: Compute, micro_batch: int, seq_len: int, checkpointing: bool,
          device: str = "cuda") -> Trace:
    """Count the activations of one forward of `spec`'s model on a (micro_batch, seq_len) batch, run as `compute`
    says on `device` ("cuda": what the plan is for; "cpu": what a CPU rehearsal really does). With checkpointing,
    a second trace without it measures the largest layer, which the backward holds again while recomputing."""
    count, kernels, applied = run_trace(spec, compute, micro_batch, seq_len, checkpointing, device)
    recompute = run_trace(spec, compute, micro_batch, seq_len, False, device)[0].largest_layer if applied else 0
    return Trace(count, applied, kernels, recompute)


def run_trace(spec, compute: Compute, micro_batch: int, seq_len: int, checkpointing: bool,
         device: str) -> tuple[ActivationCount, tuple[tuple[str, int], ...], bool]:
    import torch

    from accelkit.plan.activations.emulate import DeviceEmulation

    with torch.device("meta"):
        model = spec.build()  # on meta: fractions of a second, no memory, whatever the size
    model = model.to(getattr(torch, compute.weights))
    model.train()
    applied = enable_checkpointing(model) if checkpointing else False
    batch = spec.inputs(model, micro_batch, seq_len)
    autocast = getattr(torch, compute.autocast) if compute.autocast else None
    emulation = DeviceEmulation(device, autocast)
    with _unpacked_sequences(), emulation, ActivationCounter(model, layer_types(model)) as counter:
        loss, outputs = spec.step(model, batch)
        if compute.fp32_outputs:
            from accelerate.utils import convert_to_fp32

            outputs = convert_to_fp32(outputs)
        counter.hold(loss, outputs)
    return counter.result(), tuple(sorted(emulation.kernels.items())), applied
