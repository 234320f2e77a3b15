"""`accelkit bench --layouts`: several N-D parallelism layouts of one world size, each launched through the same
config -> launch path as `accelkit launch --dp-shard-size ... --tp-size ...` (Accelerate's ParallelismConfig).

Syntax: layouts separated by `;` (or given as repeated --layouts), each a comma-separated list of DIM=SIZE (one
accelkit.configs.Mesh each, read by its one parser) over the mesh dimensions of Accelerate's ParallelismConfig,
dp_replicate, dp_shard, tp, cp, sp, and pp, the pipeline (`accelkit launch --pp-size`: torch.distributed.pipelining;
a dimension left out is 1; `dp-shard` and `dp_shard_size` are read as `dp_shard`):

    --layouts "dp_shard=4;dp_shard=2,tp=2"        FSDP2 over 4 processes vs FSDP2 x TP (2 x 2)
    --layouts dp_replicate=2,dp_shard=2 --layouts dp_shard=4
    --layouts "dp_shard=4;dp_shard=2,pp=2;pp=2,tp=2" --pp-schedule 1f1b --microbatches 4

Each layout runs with the backend that composes it (unless --backend names one): sp -> deepspeed (Ulysses);
dp_shard or cp -> fsdp (FSDP2); tp, pp and dp_replicate alone -> ddp. --pp-schedule and --microbatches go to the
layouts with a pipeline only. The rule set then refuses what Accelerate, torch or the installed versions cannot run
(a pipeline beside cp, fewer microbatches than stages, more stages than the model's layers), before any layout
starts.
"""

from __future__ import annotations

from accelkit.configs import Mesh
from accelkit.errors import AccelkitError

EXAMPLE = 'e.g. --layouts "dp_shard=4;dp_shard=2,tp=2"'


def batch_replicas(mesh: Mesh) -> int:
    """Ranks that load the same batch: a tensor- or context-parallel group shares its batch (and Ulysses splits one
    batch's sequence), so samples and tokens are counted once per group. A pipeline's ranks each read the global
    batch and take their slice (the causal-lm template's pipeline runner), so every rank of a pp layout loads the
    same batch."""
    return mesh.world if mesh.pp > 1 else mesh.tp * mesh.cp * mesh.sp


def parse_layouts(values: tuple[str, ...] | str) -> tuple[Mesh, ...]:
    """`--layouts` values (each may hold several layouts separated by `;`) -> distinct layouts of one world size."""
    texts = [values] if isinstance(values, str) else list(values)
    parts = [part.strip() for text in texts for part in text.split(";")]
    if not any(parts):
        raise AccelkitError("--layouts: no layout given", hint=EXAMPLE)
    layouts: list[Mesh] = []
    for part in parts:
        if not part:
            continue
        layout = Mesh.parse(part, "--layouts", EXAMPLE)
        if layout.world < 2:
            raise AccelkitError(f"--layouts: {part} is one process: there is nothing to lay out",
                                hint=f"give sizes whose product is 2 or more, {EXAMPLE}")
        if layout in layouts:
            raise AccelkitError(f"--layouts: {layout.name} is given twice", hint="give each layout once")
        layouts.append(layout)
    worlds = {layout.world for layout in layouts}
    if len(worlds) > 1:
        first, other = layouts[0], next(layout for layout in layouts if layout.world != layouts[0].world)
        raise AccelkitError(f"--layouts: {first.name} is {first.world} processes but {other.name} is {other.world}: "
                            "layouts are compared at one world size",
                            hint=f"make every layout's sizes multiply to the same number, {EXAMPLE}")
    return tuple(layouts)


def check_world_size(layouts: tuple[Mesh, ...], num_processes: tuple[int, ...] | None, machines: int) -> int:
    """The world size the layouts share, checked against --num-processes and the machines."""
    world = layouts[0].world
    if num_processes is not None and num_processes != (world,):
        given = ",".join(map(str, num_processes))
        raise AccelkitError(f"--layouts: the sizes of {layouts[0].name} multiply to {world}, not --num-processes "
                            f"{given}", hint=f"drop --num-processes (the layouts set it), or give layouts whose "
                                            f"sizes multiply to {given}")
    if world % machines:
        raise AccelkitError(f"--layouts: {world} processes cannot be spread evenly over {machines} machines",
                            hint=f"give layouts whose sizes multiply to a multiple of {machines}")
    return world
