"""Output layout: one file, or HF-named shards (`model-00001-of-00003.safetensors`) plus the index transformers reads.

Shards are planned the way `save_pretrained` does it: tensors in order, a new shard when the next tensor would
overflow the limit, a tensor larger than the limit alone in its own shard.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from accelkit.errors import AccelkitError

if TYPE_CHECKING:  # the output layout is imported by the torch-free merge path too (see light_run)
    from accelkit.merge.source import TensorEntry

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "EB": 10**18,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "PIB": 2**50, "EIB": 2**60}


def parse_size(text: str) -> int:
    """'5GB' -> 5_000_000_000, '500MiB' -> 524288000 (the units transformers' max_shard_size accepts)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise AccelkitError(f"cannot read shard size {text!r}", hint="use a number with a unit, e.g. 5GB or 500MB")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size <= 0:
        raise AccelkitError("--max-shard-size must be positive", hint="e.g. --max-shard-size 5GB")
    return size


def plan_shards(entries: list[TensorEntry], max_bytes: int) -> list[list[TensorEntry]]:
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def shard_file_names(count: int) -> list[str]:
    if count == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{count:05d}.safetensors" for i in range(1, count + 1)]


def build_index(shards: list[list[TensorEntry]], names: list[str]) -> dict:
    total = sum(e.nbytes for shard in shards for e in shard)
    return {"metadata": {"total_size": total},
            "weight_map": {e.name: name for shard, name in zip(shards, names, strict=True) for e in shard}}
