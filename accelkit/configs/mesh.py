"""The one N-D mesh type: the size of each parallelism dimension, pp included, in one order, and the one parser of
its `dim=size,...` syntax (`bench --layouts`, `plan --layout`).

The order is the device mesh's, outermost first: the pipeline outside Accelerate's own dimensions (as the
templates' `(pp, dp_shard, tp)` mesh and torchtitan lay it out), then ParallelismConfig's dp_replicate, dp_shard,
cp, sp, tp. Ranks are numbered row-major over it, so a dimension's rank stride is the product of the inner sizes.
What a mesh runs with (the backend, the pipeline's schedule) belongs to the packages that choose it: bench's
layouts and plan's rows wrap a Mesh, they do not repeat it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from accelkit.errors import AccelkitError

MESH_DIMENSIONS = ("pp", "dp_replicate", "dp_shard", "cp", "sp", "tp")  # outermost first
ACCELERATE_DIMENSIONS = MESH_DIMENSIONS[1:]  # Accelerate's ParallelismConfig has no pp


@dataclass(frozen=True)
class Mesh:
    """The size of every mesh dimension (1 where not split)."""

    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    cp: int = 1
    sp: int = 1
    tp: int = 1

    @property
    def sizes(self) -> dict[str, int]:
        """Dimension -> size, in mesh order (outermost first)."""
        return {dim: getattr(self, dim) for dim in MESH_DIMENSIONS}

    @property
    def world(self) -> int:
        return math.prod(self.sizes.values())

    @property
    def name(self) -> str:
        """`dp_shard=2,tp=2,pp=2`: how the user writes it (the pipeline last), only the split dimensions."""
        written = [*ACCELERATE_DIMENSIONS, "pp"]
        return ",".join(f"{dim}={self.sizes[dim]}" for dim in written if self.sizes[dim] > 1) or "dp_replicate=1"

    @property
    def slug(self) -> str:
        """`pp2-dp_shard2`: a folder name."""
        return "-".join(f"{dim}{size}" for dim, size in self.sizes.items() if size > 1) or "one"

    def dimension_of(self, size: int | None, stride: int | None) -> str | None:
        """The mesh dimension(s) a process group of `size` ranks, `stride` apart, spans: `tp`, `dp_shard`, `pp`,
        `dp_shard_cp` (a flattened pair, as Accelerate builds them), `world`; None when no run of the mesh matches."""
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

    @property
    def natural_backend(self) -> str:
        """The backend that composes the mesh (bench's --layouts and plan's --layout choose by it): sp -> deepspeed
        (Ulysses under ZeRO-3), dp_shard or cp -> fsdp (FSDP2), else ddp."""
        if self.sp > 1:
            return "deepspeed"
        return "fsdp" if self.dp_shard > 1 or self.cp > 1 else "ddp"

    def option_values(self) -> dict[str, int]:
        """The ConfigOptions fields (--dp-shard-size, --pp-size ...) that ask for this mesh: the split dimensions."""
        return {f"{dim}_size": size for dim, size in self.sizes.items() if size > 1}

    @classmethod
    def parse(cls, text: str, where: str = "--layouts", example: str = 'e.g. "dp_shard=2,tp=2,pp=2"') -> Mesh:
        """`dp_shard=2, TP=2,pp_size=2` -> Mesh (a dimension left out is 1; `dp-shard` and `dp_shard_size` read as
        `dp_shard`); AccelkitError naming `where` with the fix."""
        sizes: dict[str, int] = {}
        for item in (part.strip() for part in text.split(",")):
            match = re.fullmatch(r"([A-Za-z_-]+)\s*=\s*(\S+)", item)
            if not match:
                raise AccelkitError(f"{where}: {item or text!r} is not DIM=SIZE", hint=example)
            dim = _dimension(match.group(1), item, where, example)
            if not match.group(2).isdigit() or int(match.group(2)) < 1:
                raise AccelkitError(f"{where}: {item!r}: a size is a whole number of 1 or more",
                                    hint=f"use {dim}=1 (or leave {dim} out) for a dimension you do not split")
            if dim in sizes:
                raise AccelkitError(f"{where}: {dim} is given twice in {text.strip()!r}",
                                    hint="give each dimension once per layout")
            sizes[dim] = int(match.group(2))
        return cls(**sizes)


def _dimension(text: str, item: str, where: str, example: str) -> str:
    name = text.strip().lower().replace("-", "_")
    name = name[:-5] if name.endswith("_size") else name
    if name not in MESH_DIMENSIONS:
        raise AccelkitError(f"{where}: unknown dimension {text.strip()!r} in {item!r}",
                            hint=f"dimensions: {', '.join(MESH_DIMENSIONS)}; {example}")
    return name
