"""The plan's N-D section: when no data-parallel strategy fits, the layouts that add tensor, context or sequence
parallelism (accelkit/plan/nd.py), the one that fits, and its commands. Shown only for transformer models with a
known shape on more than one GPU."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from accelkit.plan import nd

NEEDED_DIMS = ("hidden_size", "num_hidden_layers", "num_attention_heads")


def tp_plan_of(class_name: str) -> Mapping[str, str]:
    """The TP plan the installed transformers applies to a model of this class, Llama's when unknown.

    Read from a one-layer instance built on the meta device (no memory, milliseconds): releases differ in what the
    instance keeps (5.0 drops the head's class-level plan, so lm_head stays replicated; 5.1 and later add the input
    embedding to every plan), and only the instance says which."""
    try:
        import torch
        import transformers

        cls = getattr(transformers, class_name)
        with torch.device("meta"):
            model = cls(cls.config_class(num_hidden_layers=1))
        plan = dict(getattr(model, "tp_plan", None) or getattr(model, "_tp_plan", None) or {})
    except Exception:  # a class transformers does not export, or a config that cannot be built this way
        return nd.LLAMA_TP_PLAN
    return plan or nd.LLAMA_TP_PLAN


def nd_section(plan: Any) -> tuple[list[str], dict[str, Any]] | None:
    """(text lines, JSON) of the N-D advice for a plan where nothing fits, or None where it does not apply."""
    shape, hardware, training = plan.shape, plan.hardware, plan.training
    if plan.recommendation.strategy is not None or hardware.gpus < 2 or not shape.exact or \
            any(key not in shape.dims for key in NEEDED_DIMS):
        return None
    model = nd.Model.of(shape)
    advice = nd.advise(model, gpus=hardware.gpus, nodes=hardware.nodes, gpu_memory=hardware.gpu_memory,
                       seq_len=training.seq_len, micro_batch=training.micro_batch,
                       checkpointing=training.activation_checkpointing, optimizer=training.optimizer,
                       tp_plan=tp_plan_of(shape.name))
    lines = ["", "N-D layouts (tensor, context, sequence parallelism; per GPU):"]
    lines += [f"  {nd.describe_row(r)}" for r in advice.rows if r.unavailable is None or r.layout.tp > 1]
    lines.append(f"N-D recommendation: {advice.reason}")
    lines += [f"  {command}" for command in advice.commands]
    data = {"recommended": advice.best.layout.flags() if advice.best else None, "reason": advice.reason,
            "commands": list(advice.commands),
            "rows": [{"layout": r.layout.describe(), "unavailable": r.unavailable, "states": r.states,
                      "activations": r.activations, "gathered": r.gathered, "total": r.total, "fits": r.fits,
                      "tp_sharded": r.tp_sharded, "tp_replicated": r.tp_replicated, "traffic": dict(r.traffic)}
                     for r in advice.rows]}
    return lines, data
