"""What every checkpoint reader offers the merger: a list of tensors (name, shape, dtype) and a way to read them.

Readers validate the whole checkpoint when opened (every file present, complete, from one world size), so a bad
input fails before any output exists. Reading yields one tensor at a time in ordinary memory.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch


@dataclass(frozen=True)
class TensorEntry:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


@dataclass
class CheckpointSource:
    """Base class of the readers; subclasses fill the fields in `__init__` and implement `read`."""

    format_name: str = ""
    root: Path = Path()
    world_size: int | None = None
    entries: list[TensorEntry] = field(default_factory=list)
    # alias name -> name of the tensor it shares storage with (known from the checkpoint itself)
    aliases: dict[str, str] = field(default_factory=dict)
    # lines explaining how the input was recognised and anything notable that was skipped
    notes: list[str] = field(default_factory=list)
    # the files making up the checkpoint (for `--inspect` and the input-unchanged guarantee)
    files: list[Path] = field(default_factory=list)
    # True when the format cannot record tied weights (DCP saves both copies): ask the model's config instead
    ties_from_config: bool = False

    def read(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) for `names`, in that order, one tensor in memory at a time."""
        raise NotImplementedError

    def close(self) -> None:
        """Drop any open maps."""

    @property
    def entry_by_name(self) -> dict[str, TensorEntry]:
        return {e.name: e for e in self.entries}
