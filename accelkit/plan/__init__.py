"""`accelkit plan`: memory per GPU for every data-parallel strategy, the recommendation, and the proof.

    models.py, projects.py   MODEL -> a spec that builds the model on the meta device
    shape.py                 parameter tensors, optimizer groups, FSDP2 units, largest module
    states.py                parameters / gradients / optimizer states per rank, as each backend lays them out
    activations/             the activation counter (one definition, used by traces and measurements), the
                             meta-device trace and its CUDA/CPU emulation (autocast, attention kernels), the formula
    buffers.py, traffic.py   bucket and gather buffers, communication per step (modelled, with sources)
    estimate.py, catalog.py  one row per strategy, what fits with the headroom kept
    recommend.py             the decision tree
    planner.py, report.py    the plan, as a table and as JSON
    spine.py                 the one place that builds configs and launches (accelkit config / launch)
    measure/                 the per-rank probe and planned-vs-measured comparison (--measure)
    api.py                   the command line's values in, the plan out
"""
