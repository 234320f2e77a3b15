"""Per-rank probes: small instruments that run inside every rank of a launch, around the user's unmodified script.

A launch asks for probes with `LaunchRequest(probes=("accelkit.bench.probe", ...))`; each rank then starts in
`accelkit.rehearsal.bootstrap`, which imports every module named in $ACCELKIT_PROBES and calls its `install()`
before running the script (on CPU rehearsals and on GPUs alike). What probes share lives here:

- `imports.after_import(module, callback)`: run a patch as soon as the script imports a library (never import
  torch or Accelerate ourselves before the script does);
- `steps`: one clock for "an optimizer step happened" across plain torch, Accelerate (with gradient accumulation)
  and DeepSpeed engines, callbacks per step, and a clean stop of every rank after N steps;
- `results`: where each rank writes what it measured ($ACCELKIT_PROBE_DIR/<probe>.rank<R>.json) and how the
  launching side reads it back.
"""

from __future__ import annotations

import importlib
from typing import Any

PROBE_DIR_ENV = "ACCELKIT_PROBE_DIR"  # folder for per-rank result files
MAX_STEPS_ENV = "ACCELKIT_PROBE_MAX_STEPS"  # stop every rank cleanly after this many optimizer steps
_CONSTANTS = ["PROBE_DIR_ENV", "MAX_STEPS_ENV"]

_EXPORTS = {
    "after_import": "imports",
    "read_results": "results",
    "write_rank_result": "results",
    "StepEvent": "steps",
    "clock": "steps",
}

__all__ = sorted([*_EXPORTS, *_CONSTANTS])


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'accelkit.probes' has no attribute {name!r}")
    return getattr(importlib.import_module(f"accelkit.probes.{module}"), name)
