"""Per-rank result files of probes: each rank writes $ACCELKIT_PROBE_DIR/<probe>.rank<R>.json, the launching side
reads them back after the job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from accelkit.ranks.probes import PROBE_DIR_ENV


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def write_rank_result(probe: str, data: dict[str, Any]) -> Path | None:
    """Write this rank's result for `probe` (atomically: a reader never sees half a file). None without a folder."""
    folder = os.environ.get(PROBE_DIR_ENV)
    if not folder:
        return None
    path = Path(folder) / f"{probe}.rank{rank()}.json"
    temp = path.with_name(f".{path.name}.{os.getpid()}")
    temp.write_text(json.dumps(data), encoding="utf-8")
    os.replace(temp, path)
    return path


def read_results(folder: Path, probe: str) -> list[dict[str, Any]]:
    """Every rank's result for `probe`, ordered by rank."""
    found = []
    for path in Path(folder).glob(f"{probe}.rank*.json"):
        found.append((int(path.stem.rsplit("rank", 1)[1]), json.loads(path.read_text(encoding="utf-8"))))
    return [data for _, data in sorted(found, key=lambda item: item[0])]
