"""`plan --layout "dp_shard=8,tp=8,pp=8" [--pp-schedule S] [--microbatches M]`: one given layout, in the one mesh
syntax (accelkit.configs.Mesh.parse, the parser of bench's --layouts too), checked before anything is built."""

from __future__ import annotations

from accelkit.configs import Mesh
from accelkit.errors import AccelkitError
from accelkit.pipeline_schedules import check_microbatches, default_microbatches
from accelkit.plan import nd
from accelkit.plan.pipeline import DEFAULT_SCHEDULE, schedule_name

EXAMPLE = 'e.g. --layout "dp_shard=8,tp=8,pp=8"'


def parse_layout_option(text: str, schedule: str | None, microbatches: int | None) -> nd.Layout:
    mesh = Mesh.parse(text, "--layout", EXAMPLE)
    if mesh.pp == 1 and (schedule is not None or microbatches is not None):
        given = "--pp-schedule" if schedule is not None else "--microbatches"
        raise AccelkitError(f"{given} needs a pipeline: --layout has no pp dimension",
                            hint=f"add pp=N to --layout, {EXAMPLE}")
    name = schedule_name(schedule) if schedule is not None else DEFAULT_SCHEDULE
    if mesh.sp > 1 and mesh.pp > 1:
        raise AccelkitError("--layout: pp does not compose with sp (Ulysses runs under DeepSpeed, the pipeline "
                            "under torch's mesh)", hint="split the sequence with cp instead, or drop pp")
    if microbatches is not None:  # the rules of every command (accelkit.pipeline_schedules), before anything is built
        check_microbatches(mesh.pp, name, microbatches)
    return nd.Layout(mesh.natural_backend, mesh, schedule=name,
                     microbatches=microbatches if microbatches is not None else default_microbatches(mesh.pp, name))


def check_world(layout: nd.Layout, gpus: int | None, nodes: int) -> int:
    """The GPUs the layout is for: its product, which --num-processes (when given) must equal."""
    if layout.world < 2:
        raise AccelkitError(f"--layout {layout.name} is one process: there is nothing to lay out",
                            hint=f"give sizes whose product is 2 or more, {EXAMPLE}")
    if gpus is not None and gpus != layout.world:
        raise AccelkitError(f"--layout {layout.name} multiplies to {layout.world} GPUs, not --num-processes {gpus}",
                            hint=f"drop --num-processes (the layout sets it) or give a layout of {gpus} GPUs")
    if layout.world % nodes:
        raise AccelkitError(f"--layout {layout.name}: {layout.world} GPUs do not spread evenly over --num-machines "
                            f"{nodes}", hint=f"give a layout whose sizes multiply to a multiple of {nodes}")
    return layout.world
