"""How accurate is `accelkit plan`? Planned vs measured per GPU, beside what the peer estimators say for the same
models, in one run.

Measured: a tiny Llama and a tiny BERT (tests/data/plan/tiny_models.py: odd sizes, so padding and uneven
partitions show) train one optimizer step each under CPU rehearsals of DDP, FSDP2 full-shard and grad-op and
DeepSpeed ZeRO-1/2/3 on 2 and 4 ranks, with accelkit's probe in every rank counting what the rank holds (model
states: parameters + gradients + optimizer states, each storage once) and what its forward saved for the backward.

Peers, computed on the same model built locally from its config (no network):
- `accelerate estimate-memory`: its own functions (calculate_maximum_sizes + estimate_training_usage on the model
  it builds, AutoModel from the config), i.e. its "Training using Adam" figure in bf16; it has no notion of ranks.
- DeepSpeed's estimate_zero2_model_states_mem_needs / estimate_zero3_model_states_mem_needs (GPU bytes per
  device, with their 1.5x buffer factor), for the ZeRO rows.
- Korthikanti et al.'s activation formula (accelkit.plan.activations.formula) for the activation column.

    python benchmarks/plan_accuracy.py [--ranks 2,4]

The last line reads `worst error: model states X%, activations Y%` (accelkit's plan against the measurement).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "plan"
sys.path.insert(0, str(DATA))
LAUNCHES = [("ddp", "-", ()), ("fsdp", "-", ("--fsdp-modes", "full,grad-op")),
            ("deepspeed", "1", ("--zero-stages", "1,2,3"))]
PRECISION = "bf16-mixed"


def run_launches(ranks: list[int], folder: Path) -> list[dict]:
    from rehearse import rehearse

    records = []
    for world in ranks:
        for backend, stage, args in LAUNCHES:
            start = time.perf_counter()
            records += rehearse(backend, world, stage, args, folder / f"{backend}-{world}")
            print(f"  measured {backend} on {world} CPU ranks in {time.perf_counter() - start:.0f} s", file=sys.stderr)
    return records


STRATEGY = {"ddp": "DDP", "fsdp-full": "FSDP full", "fsdp-grad-op": "FSDP grad-op", "zero1": "ZeRO-1",
            "zero2": "ZeRO-2", "zero3": "ZeRO-3"}


def peers(name: str, world: int) -> dict[str, int]:
    """What accelerate estimate-memory and DeepSpeed's estimators say for this model."""
    import tiny_models
    import torch
    from accelerate import init_empty_weights
    from accelerate.commands.estimate import estimate_training_usage
    from accelerate.utils import calculate_maximum_sizes
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs
    from transformers import AutoModel

    with init_empty_weights():  # what `accelerate estimate-memory` builds: AutoModel from the config, fp32
        base = AutoModel.from_config(tiny_models.CONFIGS[name], dtype=torch.float32)
    total, _ = calculate_maximum_sizes(base)
    accelerate_bf16 = max(estimate_training_usage(total, "bfloat16").values())
    with torch.device("meta"):
        model = tiny_models.build(name)
    params = sum(p.numel() for p in model.parameters())
    largest = max(sum(p.numel() for p in m.parameters(recurse=False)) for m in model.modules())
    _, zero2 = estimate_zero2_model_states_mem_needs(params, world, 1, cpu_offload=False)
    _, zero3, _ = estimate_zero3_model_states_mem_needs(params, largest, world, 1, cpu_offload=False)
    return {"accelerate": int(accelerate_bf16), "ZeRO-2": zero2, "ZeRO-3": zero3, "ZeRO-1": None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="2,4", help="world sizes to measure (comma-separated)")
    args = parser.parse_args()
    ranks = [int(r) for r in args.ranks.split(",")]

    import tiny_models
    from rehearse import case

    from accelkit.plan.activations.formula import korthikanti
    from accelkit.plan.activations.trace import trace
    from accelkit.plan.measure.compare import state_figures
    from accelkit.plan.models import ModelSpec, hf_inputs, hf_step
    from accelkit.plan.planner import compute_for
    from accelkit.plan.shape import shape_from_model

    with tempfile.TemporaryDirectory(prefix="accelkit-plan-accuracy-") as folder:
        records = run_launches(ranks, Path(folder))

    rows: dict[tuple, dict] = {}
    for record in records:
        name = tiny_models.CLASSES[record["model"]]
        key = (name, STRATEGY[case(record)], record["world_size"])
        states = state_figures(record, PRECISION)
        planned = sum(f.planned for f in states)
        measured = sum(f.measured for f in states)
        row = rows.setdefault(key, {"planned": 0, "measured": 0, "state_error": 0.0, "act": None})
        if measured > row["measured"]:  # the rank holding the most
            row.update(planned=planned, measured=measured)
        row["state_error"] = max(row["state_error"], max(abs(f.error) for f in states))
        spec = ModelSpec(label=name, build=lambda n=name: tiny_models.build(n), inputs=hf_inputs, step=hf_step)
        batch, seq = record["inputs"]["shapes"]["input_ids"]
        family = {"deepspeed": "deepspeed", "fsdp": "fsdp"}.get(record["backend"], "torch")
        plan_act = trace(spec, compute_for(family, PRECISION), batch, seq, False, device="cpu").activations
        import torch

        with torch.device("meta"):
            dims = shape_from_model(tiny_models.build(name), name).dims
        row["act"] = (record["activations"]["total"], plan_act, korthikanti(dims, batch, seq, False), batch, seq)

    def err(planned, measured) -> str:
        return "-" if planned is None else f"{planned:>10,} ({(planned - measured) / measured:+7.1%})"

    header = (f"{'model':6} {'strategy':13} {'N':>2} | {'measured states':>15} | {'accelkit plan':>21} | "
              f"{'DeepSpeed estimator':>22} | {'accelerate est-mem':>22} || {'measured act.':>13} | "
              f"{'accelkit plan':>21} | {'Korthikanti formula':>21}")
    print("Model states and activations per GPU (bytes, the rank holding the most), planned vs measured after one "
          "optimizer step on CPU ranks (bf16 mixed, AdamW, two optimizer groups):")
    print(header)
    print("-" * len(header))
    worst_states = worst_act = 0.0
    for (name, strat, world), row in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
        peer = peers(name, world)
        measured_act, plan_act, formula, _, _ = row["act"]
        worst_states = max(worst_states, row["state_error"])
        worst_act = max(worst_act, abs(plan_act - measured_act) / measured_act)
        print(f"{name:6} {strat:13} {world:>2} | {row['measured']:>15,} | {err(row['planned'], row['measured'])} | "
              f"{err(peer.get(strat), row['measured']):>22} | {err(peer['accelerate'], row['measured'])} || "
              f"{measured_act:>13,} | {err(plan_act, measured_act)} | {err(formula, measured_act)}")
    print("DeepSpeed's estimators cover model states of ZeRO-2/3 only (x1.5 buffer factor); accelerate estimate-memory "
          "has one figure per model (no ranks, no activations, no batch).")
    print(f"worst error: model states {worst_states * 100:.2f}%, activations {worst_act * 100:.2f}%")


if __name__ == "__main__":
    main()
