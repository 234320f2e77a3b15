"""Put a plan together: the model's shape, its activations as each backend runs it, one estimate per strategy,
the recommendation and the batch / learning-rate advice."""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field
from typing import Any

from accelkit.errors import AccelkitError, clip
from accelkit.plan.activations.trace import Compute, trace
from accelkit.plan.catalog import BY_NAME, STRATEGIES
from accelkit.plan.estimate import Estimate, estimate
from accelkit.plan.inputs import Hardware, Training
from accelkit.plan.models import ModelSpec
from accelkit.plan.recommend import Recommendation, recommend
from accelkit.plan.shape import ModelShape, shape_from_count, shape_from_model

FAMILY_LABEL = {"torch": "one device / DDP", "fsdp": "FSDP2", "deepspeed": "DeepSpeed"}


@dataclass(frozen=True)
class Activations:
    bytes: int | None
    weight_copies: int
    source: str


@dataclass(frozen=True)
class LearningRate:
    effective_batch: int
    base_lr: float
    base_batch: int

    @property
    def factor(self) -> float:
        return self.effective_batch / self.base_batch

    @property
    def linear(self) -> float:
        return self.base_lr * self.factor

    @property
    def sqrt(self) -> float:
        return self.base_lr * math.sqrt(self.factor)


@dataclass
class Plan:
    spec: ModelSpec
    shape: ModelShape
    hardware: Hardware
    training: Training
    rows: list[Estimate]
    recommendation: Recommendation
    activations: dict[str, Activations]
    device: str = "cuda"
    notes: list[str] = field(default_factory=list)
    compression: Any = None  # --grad-compression's CompressionSpec (accelkit.compression), None: not given
    layout_choice: Any = None  # nd.NdAdvice: the N-D or pipeline layout recommended (or asked for with --layout)

    def row(self, name: str) -> Estimate:
        return next(r for r in self.rows if r.strategy.name == name)

    @property
    def chosen(self) -> Estimate | None:
        return None if self.recommendation.strategy is None else self.row(self.recommendation.strategy)

    def batch(self) -> tuple[int, int, int, int, str]:
        """(effective batch, micro-batch, data-parallel ranks, accumulation x pipeline micro-batches, how) of the
        recommended job; with nothing recommended, of plain data parallelism over every GPU."""
        tr, chosen, choice = self.training, self.chosen, self.layout_choice
        if choice is not None:
            layout = (choice.best or choice.rows[0]).layout
            ranks = layout.world // layout.batch_replicas
            steps = layout.pipeline.microbatches if layout.mesh.pp > 1 else 1
            with contextlib.suppress(AccelkitError):  # a --global-batch the layout's batch does not divide
                steps *= tr.accumulation(ranks * steps)
            what = "pipeline micro-batch(es)" if layout.mesh.pp > 1 else "accumulation step(s)"
            return tr.micro_batch * ranks * steps, tr.micro_batch, ranks, steps, what
        ranks = self.hardware.gpus if chosen is None or chosen.strategy.distributed else 1
        steps = chosen.accumulation if chosen is not None else tr.accumulation(ranks)
        return tr.micro_batch * ranks * steps, tr.micro_batch, ranks, steps, "accumulation step(s)"

    def learning_rate(self) -> LearningRate | None:
        if self.training.base_lr is None:
            return None
        return LearningRate(self.batch()[0], self.training.base_lr, self.training.base_batch)


def compute_for(family: str, precision: str) -> Compute:
    """How a backend runs the forward under Accelerate (see activations/trace.py)."""
    if precision in ("fp32", "bf16"):
        weights = "float32" if precision == "fp32" else "bfloat16"
        return Compute(weights, None, False)
    low = "bfloat16" if precision == "bf16-mixed" else "float16"
    if family == "torch":  # fp32 weights, autocast, outputs converted back to fp32
        return Compute("float32", low, True)
    if family == "fsdp":  # MixedPrecisionPolicy(param_dtype=low) gathers 16-bit weights; Accelerate autocasts
        # too, and FSDP2's output_dtype=low casts Accelerate's fp32 outputs back to 16 bits
        return Compute(low, low, False)
    return Compute(low, None, False)  # DeepSpeed: 16-bit weights, no autocast


def build_shape(spec: ModelSpec) -> ModelShape:
    if spec.build is None:
        return shape_from_count(spec.parameters or 0, spec.label)
    import torch

    with torch.device("meta"):
        model = spec.build()
    if getattr(model, "main_input_name", "input_ids") != "input_ids":  # images, audio: no sequence length to set
        spec.sequence_input = False
    return shape_from_model(model, spec.label)


def activations_for(spec: ModelSpec, shape: ModelShape, training: Training, family: str,
                    device: str) -> Activations:
    from accelkit.plan.activations.formula import korthikanti

    if spec.build is None:
        return Activations(None, 0, "not modelled (no model shape)")
    compute = compute_for(family, training.precision)
    try:
        result = trace(spec, compute, training.micro_batch, training.seq_len, training.activation_checkpointing,
                       device=device)
    except AccelkitError:
        raise
    except Exception as exc:  # a model whose forward cannot run on meta tensors: fall back to the formula
        first = clip((str(exc).strip().splitlines() or [type(exc).__name__])[0], 200)
        fallback = korthikanti(shape.dims, training.micro_batch, training.seq_len, training.activation_checkpointing)
        source = f"Korthikanti et al. formula (tracing failed: {first})" if fallback is not None else \
            f"not modelled (tracing failed: {first})"
        return Activations(fallback, 0, source)
    kernels = ", ".join(f"{name} x{count}" for name, count in result.kernels) or "none"
    how = f"{compute.weights} weights" + (f", {compute.autocast} autocast" if compute.autocast else "")
    return Activations(result.activations, result.count.weight_copies,
                       f"traced on the meta device ({how}; attention: {kernels})")


def make_plan(spec: ModelSpec, hardware: Hardware, training: Training, *, prefer: str = "any",
              strategy: str | None = None, device: str = "cuda", shape: ModelShape | None = None) -> Plan:
    shape = shape or build_shape(spec)
    notes = list(spec.notes) + list(shape.notes)
    if strategy is not None:
        reason = BY_NAME[strategy].not_applicable(hardware.gpus, hardware.nodes)
        if reason is not None:
            raise AccelkitError(f"--strategy {strategy} cannot run on {hardware.gpus} GPU(s) on "
                                f"{hardware.nodes} machine(s): {reason}", hint=_alternative(strategy, hardware))
    training.accumulation(hardware.gpus)  # a global batch that does not divide is refused before any tracing
    families = sorted({s.family for s in STRATEGIES})
    acts = {family: activations_for(spec, shape, training, family, device) for family in families}
    rows = [estimate(s, shape, hardware, training, acts[s.family].bytes, acts[s.family].weight_copies)
            for s in STRATEGIES]
    choice = recommend(rows, hardware.gpus, hardware.nodes, prefer, training.activation_checkpointing, strategy)
    return Plan(spec=spec, shape=shape, hardware=hardware, training=training, rows=rows, recommendation=choice,
                activations=acts, device=device, notes=notes)


def _alternative(strategy: str, hardware: Hardware) -> str:
    if BY_NAME[strategy].sharding == "hybrid":
        return "on one machine use --strategy fsdp-full; hybrid sharding needs --num-machines 2 or more"
    if hardware.gpus == 1:
        offload = "zero3-offload" if BY_NAME[strategy].family == "deepspeed" else "fsdp-offload"
        return f"on one GPU use --strategy single, or --strategy {offload} to move the model states to CPU memory"
    return "pick another --strategy (see the table without --strategy)"
