"""Per-rank probes: small instruments that run inside every rank of a launch, around the user's unmodified script.

A launch asks for probes with `LaunchRequest(probes=("accelkit.bench.probe", ...))`; each rank then starts in
`accelkit.ranks.bootstrap`, which imports every module named in $ACCELKIT_PROBES and calls its `install()`
before running the script (on CPU rehearsals and on GPUs alike). What probes share lives here:

- `imports.after_import(module, callback)`: run a patch as soon as the script imports a library (never import
  torch or Accelerate ourselves before the script does);
- `steps`: one clock for "an optimizer step happened" across plain torch, Accelerate (with gradient accumulation)
  and DeepSpeed engines, callbacks per step, and a clean stop of every rank after N steps;
- `results`: where each rank writes what it measured ($ACCELKIT_PROBE_DIR/<probe>.rank<R>.json) and how the
  launching side reads it back.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

PROBE_DIR_ENV = "ACCELKIT_PROBE_DIR"  # folder for per-rank result files
MAX_STEPS_ENV = "ACCELKIT_PROBE_MAX_STEPS"  # stop every rank cleanly after this many optimizer steps

__all__, __getattr__ = lazy_exports(__name__, {
    "after_import": "imports",
    "read_results": "results",
    "write_rank_result": "results",
    "StepEvent": "steps",
    "clock": "steps",
}, also=["PROBE_DIR_ENV", "MAX_STEPS_ENV"])
