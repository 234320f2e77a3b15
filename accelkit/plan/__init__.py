"""`accelkit plan`: memory per GPU for every data-parallel strategy, the recommendation, and the proof.

    api.py                   the command line's values in, the plan out (checks first, then the work)
    inputs.py                hardware and training settings (sizes and counts: accelkit.sizes)
    models.py, projects.py   MODEL -> a spec that builds the model on the meta device (config, Hub, project, shape)
    shape.py                 parameter tensors, optimizer groups, FSDP2 units, largest module
    states.py                parameters / gradients / optimizer states per rank, as each backend lays them out
    activations/             the activation counter (one definition, used by traces and measurements), the
                             meta-device trace and its CUDA/CPU emulation (autocast, attention kernels), the formula
    buffers.py, traffic.py   bucket and gather buffers, communication per step (modelled, with sources)
    catalog.py, estimate.py  the strategies; one row per strategy, what fits with the headroom kept
    recommend.py             the decision tree
    planner.py, report.py    the plan, as a table and as JSON
    spine.py                 the one place that builds configs and launches (what `accelkit config` / `launch` use)
    measure/                 the per-rank probe, what a rank holds, planned-vs-measured (--measure)
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "run_plan": "api",
    "PlanRequest": "api",
    "ShapeFlags": "models",
    "Pipeline": "pipeline",  # a schedule's stages, bubble and point-to-point sends (bench's pp layouts too)
})
