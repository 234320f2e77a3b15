"""One model's traced activations split into the parts every layout scales differently: what each decoder layer
keeps, what one layer holds while it is recomputed, and what lives outside the layers (embeddings, final norm,
logits, loss). Every row of a plan (data-parallel strategies, N-D and pipeline layouts) is priced from this one
profile, so no two parts of an output disagree.

From two traces of the same batch (trace.py), with and without activation checkpointing, of a model with L layers:

    layer = what the largest layer saves without checkpointing (its working set when the backward recomputes it)
    rest  = saved without checkpointing - L * layer + the outputs the script holds
    kept  = (saved with checkpointing - (saved without - L * layer)) / L   (a checkpointed layer's inputs)

so that L*layer + rest is the traced total without checkpointing and L*kept + layer + rest the total with it,
exactly. A model that cannot be traced gets the same parts from Korthikanti et al.'s formula (formula.py).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Profile:
    layers: int  # decoder layers traced
    layer: int  # bytes one layer saves without checkpointing
    kept: int  # bytes one checkpointed layer keeps (its inputs)
    rest: int  # bytes outside the layers: embeddings, final norm, logits and loss, held outputs
    source: str

    def total(self, checkpointing: bool) -> int:
        """The whole model on one rank, one micro-batch: what the data-parallel rows use."""
        if checkpointing:
            return self.layers * self.kept + self.layer + self.rest
        return self.layers * self.layer + self.rest


def from_counts(with_checkpointing, without, source: str) -> Profile | None:
    """From the ActivationCounts of the two traces; None where the model has no checkpointable layers."""
    layers = without.layers
    if not layers or not with_checkpointing.layers:
        return None
    layer = without.largest_layer
    outside = max(without.saved - layers * layer, 0)
    kept = max((with_checkpointing.saved - outside) // layers, 0)
    return Profile(layers, layer, kept, outside + without.outputs, source)


def from_formula(dims: dict[str, int], micro_batch: int, seq_len: int) -> Profile | None:
    """Korthikanti et al. (16-bit, flash attention): 34*s*b*h per layer, its 2*s*b*h input when checkpointed, the
    fp32 logits outside."""
    if any(key not in dims for key in ("hidden_size", "num_hidden_layers")):
        return None
    tokens = seq_len * micro_batch
    h = dims["hidden_size"]
    return Profile(dims["num_hidden_layers"], 34 * tokens * h, 2 * tokens * h, tokens * dims.get("vocab_size", 0) * 4,
                   "Korthikanti et al. formula (the model was not traced)")


def traced(spec, compute, micro_batch: int, seq_len: int, device: str) -> Profile | None:
    """Trace `spec` both ways on the meta device (see trace.py) and split the result."""
    from accelkit.plan.activations.trace import run_trace

    with_ck, kernels, applied = run_trace(spec, compute, micro_batch, seq_len, True, device)
    if not applied:
        return None
    without = run_trace(spec, compute, micro_batch, seq_len, False, device)[0]
    names = ", ".join(f"{name} x{count}" for name, count in kernels) or "none"
    return from_counts(with_ck, without, f"traced on the meta device with and without checkpointing (attention: "
                                         f"{names})")
