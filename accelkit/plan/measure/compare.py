"""Planned vs measured, per rank: the plan recomputed for exactly what a rank ran (its model's parameter shapes, its
optimizer's groups, its backend and world size), next to what the probe counted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from accelkit.plan import states
from accelkit.plan.shape import ModelShape, ParamTensor


@dataclass(frozen=True)
class Figure:
    name: str  # parameters | gradients | optimizer | activations | ...
    planned: int
    measured: int | None

    @property
    def error(self) -> float | None:
        """Relative error of the plan against the measurement (0.01 = the plan is 1% high)."""
        if self.measured is None:
            return None
        if self.measured == 0:
            return 0.0 if self.planned == 0 else float("inf")
        return (self.planned - self.measured) / self.measured


def shape_of(record: dict[str, Any]) -> ModelShape:
    """The model a rank trained, from the probe's record (global parameter shapes and optimizer groups)."""
    tensors = tuple(ParamTensor(name, tuple(shape), trainable) for name, shape, trainable in record["shapes"])
    shape = ModelShape(name=record["model"], source="the script's model", parameters=sum(t.numel for t in tensors),
                       tensors=tensors)
    return shape.with_groups(record["groups"])


def backend_family(record: dict[str, Any]) -> str:
    return {"deepspeed": "deepspeed", "fsdp": "fsdp"}.get(record["backend"], "torch")


def planned_states(record: dict[str, Any], precision: str, optimizer: str) -> states.States:
    """What the plan says this rank holds, for the backend and world size it ran with."""
    shape = shape_of(record)
    fam = backend_family(record)
    dt = states.dtypes_for(fam, precision)
    world, rank = record["world_size"], record["rank"]
    if fam == "deepspeed":
        stage = record["zero_stage"]
        if stage == 3:
            return states.zero3(shape, dt, optimizer, world, record.get("persistence_threshold",
                                                                         states.PERSISTENCE_THRESHOLD))
        return states.zero12(shape, dt, optimizer, world, rank, stage)
    if fam == "fsdp":
        return states.fsdp2(shape, dt, optimizer, world, rank)
    return states.replicated(shape, dt, optimizer)


def state_figures(record: dict[str, Any], precision: str, optimizer: str = "adamw") -> list[Figure]:
    planned = planned_states(record, precision, optimizer)
    return [Figure("parameters", planned.parameters, record["parameters"]),
            Figure("gradients", planned.gradients, record["gradients"]),
            Figure("optimizer", planned.optimizer, record["optimizer"])]
