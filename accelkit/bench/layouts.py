"""`accelkit bench --layouts`: several N-D parallelism layouts of one world size, each launched through the same
config -> launch path as `accelkit launch --dp-shard-size ... --tp-size ...` (Accelerate's ParallelismConfig).

Syntax: layouts separated by `;` (or given as repeated --layouts), each a comma-separated list of DIM=SIZE with the
mesh dimensions of Accelerate's ParallelismConfig: dp_replicate, dp_shard, tp, cp, sp, and pp, the pipeline
(`accelkit launch --pp-size`: torch.distributed.pipelining; a dimension left out is 1; `dp-shard` and
`dp_shard_size` are read as `dp_shard`):

    --layouts "dp_shard=4;dp_shard=2,tp=2"        FSDP2 over 4 processes vs FSDP2 x TP (2 x 2)
    --layouts dp_replicate=2,dp_shard=2 --layouts dp_shard=4
    --layouts "dp_shard=4;dp_shard=2,pp=2;pp=2,tp=2" --pp-schedule 1F1B --microbatches 4

Each layout runs with the backend that composes it (unless --backend names one): sp -> deepspeed (Ulysses);
dp_shard or cp -> fsdp (FSDP2); tp, pp and dp_replicate alone -> ddp. --pp-schedule and --microbatches go to the
layouts with a pipeline only. The rule set then refuses what Accelerate, torch or the installed versions cannot run
(a pipeline beside cp, fewer microbatches than stages, more stages than the model's layers), before any layout
starts.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from accelkit.errors import AccelkitError

# the mesh order, outermost first: the pipeline outside Accelerate's own (as the template's (pp, dp_shard, tp) mesh)
DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")
EXAMPLE = 'e.g. --layouts "dp_shard=4;dp_shard=2,tp=2"'


@dataclass(frozen=True)
class Layout:
    """One N-D layout: the size of every mesh dimension (1 where not split)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    sp: int = 1
    tp: int = 1

    @property
    def sizes(self) -> dict[str, int]:
        return {dim: getattr(self, dim) for dim in DIMENSIONS}

    @property
    def world(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def name(self) -> str:
        """`dp_shard=2,tp=2`: how the user writes it (and the table shows it)."""
        sizes = [*((dim, size) for dim, size in self.sizes.items() if dim != "pp"), ("pp", self.pp)]
        return ",".join(f"{dim}={size}" for dim, size in sizes if size > 1) or "dp_replicate=1"

    @property
    def slug(self) -> str:
        """`dp_shard2-tp2`: a folder name."""
        return "-".join(f"{dim}{size}" for dim, size in self.sizes.items() if size > 1) or "one"

    @property
    def batch_replicas(self) -> int:
        """Ranks that load the same batch: a tensor- or context-parallel group shares its batch (and Ulysses
        splits one batch's sequence), so samples and tokens are counted once per group. A pipeline's ranks each
        read the global batch and take their slice (the causal-lm template's pipeline runner), so every rank
        of a pp layout loads the same batch."""
        return self.world if self.pp > 1 else self.tp * self.cp * self.sp

    @property
    def natural_backend(self) -> str:
        if self.sp > 1:
            return "deepspeed"
        if self.dp_shard > 1 or self.cp > 1:
            return "fsdp"
        return "ddp"

    def dimension_of(self, size: int | None, stride: int | None) -> str | None:
        """The mesh dimension(s) a process group of `size` ranks, `stride` apart, spans: `tp`, `dp_shard`,
        `dp_shard_cp` (a flattened pair, as Accelerate builds them), `world`; None when no run of the mesh matches.
        Ranks are laid out row-major in DIMENSIONS order, so a dimension's stride is the product of the inner ones."""
        if not size or not stride:
            return None
        if size == self.world:
            return "world"
        split = [(dim, n) for dim, n in self.sizes.items() if n > 1]
        for first in range(len(split)):
            for last in range(first, len(split)):
                run = split[first:last + 1]
                inner = math.prod(n for _, n in split[last + 1:])
                if math.prod(n for _, n in run) == size and inner == stride:
                    return "_".join(dim for dim, _ in run)
        return None

    def option_values(self) -> dict[str, int]:
        """The ConfigOptions fields (--dp-shard-size ...) that ask for this layout: only the split dimensions."""
        return {f"{dim}_size": size for dim, size in self.sizes.items() if size > 1}


def _dimension(text: str, item: str) -> str:
    name = text.strip().lower().replace("-", "_")
    name = name[:-5] if name.endswith("_size") else name
    if name not in DIMENSIONS:
        raise AccelkitError(f"--layouts: unknown dimension {text.strip()!r} in {item!r}",
                            hint=f"dimensions: {', '.join(DIMENSIONS)}; {EXAMPLE}")
    return name


def parse_layout(text: str) -> Layout:
    sizes: dict[str, int] = {}
    for item in (part.strip() for part in text.split(",")):
        match = re.fullmatch(r"([A-Za-z_-]+)\s*=\s*(\S+)", item)
        if not match:
            raise AccelkitError(f"--layouts: {item or text!r} is not DIM=SIZE", hint=EXAMPLE)
        dim = _dimension(match.group(1), item)
        if not match.group(2).isdigit() or int(match.group(2)) < 1:
            raise AccelkitError(f"--layouts: {item!r}: a size is a whole number of 1 or more",
                                hint=f"use {dim}=1 (or leave {dim} out) for a dimension you do not split")
        if dim in sizes:
            raise AccelkitError(f"--layouts: {dim} is given twice in {text.strip()!r}",
                                hint="give each dimension once per layout")
        sizes[dim] = int(match.group(2))
    return Layout(**sizes)


def parse_layouts(values: tuple[str, ...] | str) -> tuple[Layout, ...]:
    """`--layouts` values (each may hold several layouts separated by `;`) -> distinct layouts of one world size."""
    texts = [values] if isinstance(values, str) else list(values)
    parts = [part.strip() for text in texts for part in text.split(";")]
    if not any(parts):
        raise AccelkitError("--layouts: no layout given", hint=EXAMPLE)
    layouts: list[Layout] = []
    for part in parts:
        if not part:
            continue
        layout = parse_layout(part)
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


def check_world_size(layouts: tuple[Layout, ...], num_processes: tuple[int, ...] | None, machines: int) -> int:
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
