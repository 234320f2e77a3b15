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


def profile_for(plan: Any, checkpointing: bool):
    """The activation profile every layout row is priced from: the plan's own model traced the way FSDP2 runs it
    (activations/profile.py); the formula's where the model cannot be traced."""
    from accelkit.plan.activations.profile import from_formula, traced
    from accelkit.plan.planner import compute_for

    spec, training = plan.spec, plan.training
    if spec.build is not None:
        try:
            found = traced(spec, compute_for("fsdp", training.precision), training.micro_batch, training.seq_len,
                           plan.device)
        except Exception:  # a forward meta tensors cannot run: the formula below, as the main table does
            found = None
        if found is not None:
            return found
    return from_formula(plan.shape.dims, training.micro_batch, training.seq_len)


def applies(plan: Any) -> bool:
    shape = plan.shape
    return plan.hardware.gpus >= 2 and shape.exact and all(key in shape.dims for key in NEEDED_DIMS)


def nd_section(plan: Any, layout: nd.Layout | None = None) -> tuple[list[str], dict[str, Any], nd.NdAdvice] | None:
    """(text lines, JSON, advice) of the N-D and pipeline layouts: the one given (`layout`), or every candidate with
    activation checkpointing (the cheaper remedy comes first: the caller tried checkpointing before sharding)."""
    from accelkit.errors import AccelkitError
    from accelkit.plan.inputs import MIXED_PRECISION
    from accelkit.plan.pipeline import check_pipeline

    shape, hardware, training = plan.shape, plan.hardware, plan.training
    if not applies(plan):
        if layout is not None:
            raise AccelkitError(f"--layout needs a transformer's shape (hidden size, layers, heads): "
                                f"{shape.name} has none to split", hint="plan a Hugging Face model or give "
                                                                         "--layers --hidden --heads")
        return None
    model = nd.Model.of(shape)
    checkpointing = training.activation_checkpointing if layout is not None else True
    if layout is not None:
        check_pipeline(layout.pipeline, model.layers)
        why = nd.unavailable(layout, model, hardware.gpus, hardware.nodes)
        if why is not None:
            raise AccelkitError(f"--layout {layout.name} cannot run here: {why}",
                                hint="give another layout (bench's syntax: dp_replicate, dp_shard, cp, sp, tp, pp)")
    profile = profile_for(plan, checkpointing)
    advice = nd.advise(model, gpus=hardware.gpus, nodes=hardware.nodes, gpu_memory=hardware.gpu_memory,
                       seq_len=training.seq_len, micro_batch=training.micro_batch, checkpointing=checkpointing,
                       optimizer=training.optimizer, tp_plan=tp_plan_of(shape.name),
                       profile=profile, precision=MIXED_PRECISION[training.precision],
                       layouts=[layout] if layout is not None else None, buffers=_table_buffers(plan),
                       asked=layout is not None)
    if layout is not None and advice.best is None:  # the given layout: its commands whether or not it fits
        advice = nd.NdAdvice(None, advice.rows, advice.reason,
                             nd.layout_commands(layout, hardware.gpus, hardware.nodes,
                                                MIXED_PRECISION[training.precision], checkpointing))
    title = "Layout (--layout; per GPU, the rank that needs the most):" if layout is not None else \
        "N-D and pipeline layouts (activation checkpointing; per GPU, the rank that needs the most):"
    lines = ["", title]
    lines += [f"  {nd.describe_row(r)}" for r in advice.rows if r.unavailable is None or r.layout.mesh.tp > 1]
    data = {"recommended": advice.best.layout.flags() if advice.best else None, "reason": advice.reason,
            "commands": list(advice.commands), "checkpointing": checkpointing,
            "activations_source": profile.source if profile else None,
            "rows": [_row_json(r) for r in advice.rows]}
    return lines, data, advice


def _table_buffers(plan: Any) -> dict[str, int]:
    """The data-parallel table's buffers of the strategies that shard like the no-tp layouts: FSDP full shard
    (over dp_shard x cp, every GPU) and ZeRO-3 (every GPU)."""
    out = {}
    for backend, name in (("fsdp", "fsdp-full"), ("deepspeed", "zero3")):
        row = next((r for r in plan.rows if r.strategy.name == name and r.unavailable is None), None)
        if row is not None:
            out[backend] = row.buffers
    return out


def _row_json(r: nd.Row) -> dict[str, Any]:
    out = {"layout": r.layout.describe(), "name": r.layout.name, "unavailable": r.unavailable, "states": r.states,
           "activations": r.activations, "gathered": r.gathered, "total": r.total, "fits": r.fits,
           "tp_sharded": r.tp_sharded, "tp_replicated": r.tp_replicated, "traffic": dict(r.traffic)}
    if r.layout.mesh.pp > 1:
        pipeline = r.layout.pipeline
        out["pipeline"] = {"pp": pipeline.ranks, "schedule": pipeline.schedule, "microbatches": pipeline.microbatches,
                           "stages_per_rank": pipeline.stages_per_rank, "bubble": r.bubble,
                           "worst_rank": r.worst_rank, "p2p_bytes_per_step": r.traffic.get("pp", 0)}
    return out
