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

N-D rows (plan's accelkit/plan/nd.py): the model-state bytes rank 0 holds in CPU rehearsals of tensor parallelism 2,
HSDP 2 x 2, FSDP2 4 and FSDP2 2 x TP 2 (tests/data/nd/train_nd.py on a tiny Llama through `accelkit launch --cpu`:
transformers' TP plan, FSDP2 over Accelerate's mesh, one AdamW step), measured with `to_local()`. A layout the
installed versions cannot run (FSDP2 x TP with a transformers that has neither the ReplicateParallel Accelerate
imports nor what accelkit's workaround uses) prints launch's one-line refusal instead.
No peer estimates N-D layouts from a model (DeepSpeed's and Accelerate's estimators know no TP).

Pipeline rows measured: the causal-lm template's own pipeline (templates/causal-lm/pipeline_parallel.py, its
default 2-layer Llama, one AdamW per stage module) through `accelkit launch --cpu --pp-size 2 --microbatches 4`,
pp 2 under 1F1B and GPipe and dp_shard 2 x pp 2 (FSDP2 inside each stage group) under 1F1B, one optimizer step.
Two probes in every rank: tests/data/nd/pp_states_probe.py counts the rank's parameters, gradients and AdamW moments
after the step (local shards), against the plan's model states of each pipeline rank (nd.row: stages by layer, the
embedding on the first, norm and head on the last, split by dp_shard); tests/data/nd/pp_activations_probe.py
tracks the tensors autograd saves for the backward during the schedule's step (each storage once, released when
its backward frees it) and the stage outputs torch caches until their micro-batch's backward (`fwd_cache`: the
hidden state a stage sends on, the last stage's logits), and reports the peak of both alive at once, against the
plan's in-flight activations of that pipeline rank (pipeline.py: 1F1B keeps p - r micro-batches, GPipe all m; the
traced profile of the template's model, fp32, no checkpointing). The saved tensors' own peak is printed beside it.

Pipeline rows on paper (accelkit/plan/published.py): torchtitan's Llama 3.1 405B on 512 H100 as FSDP 8 x TP 8 x
PP 8 with 1F1B and Interleaved1F1B (published peak 82.5 and 72.7 GiB; tests/unit/plan/test_pp_plan.py holds the
plan within 10%), and GPT-3 175B's 64 x 8 x 8 shape.

    python benchmarks/plan_accuracy.py [--ranks 2,4 | --ranks ''] [--nd-layouts tp2,hsdp2x2,fsdp4,fsdp2xtp2 | '']
        [--pp-layouts pp2,pp2gpipe,fsdp2xpp2 | '']

The last line reads `worst error: model states X%, activations Y%` (accelkit's plan against the measurement, the
N-D and pipeline rows included).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
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
ND_SCRIPT = REPO / "tests" / "data" / "nd" / "train_nd.py"
ND_TINY = {"layers": 2, "hidden": 32, "heads": 4, "kv_heads": 2, "vocab": 64, "intermediate": 64}
ND_FLAGS = {  # name: (Layout arguments, launch flags)
    "tp2": ({"backend": "ddp", "tp": 2}, ["--backend", "ddp", "--num-processes", "2", "--tp-size", "2"]),
    "hsdp2x2": ({"backend": "fsdp", "dp_replicate": 2, "dp_shard": 2},
                ["--backend", "fsdp", "--num-processes", "4", "--dp-replicate-size", "2", "--dp-shard-size", "2"]),
    "fsdp4": ({"backend": "fsdp", "dp_shard": 4},
              ["--backend", "fsdp", "--num-processes", "4", "--dp-shard-size", "4"]),
    "fsdp2xtp2": ({"backend": "fsdp", "dp_shard": 2, "tp": 2},
                  ["--backend", "fsdp", "--num-processes", "4", "--dp-shard-size", "2", "--tp-size", "2"]),
}

TEMPLATE = REPO / "templates" / "causal-lm" / "train.py"
PP_PROBE_DIR = REPO / "tests" / "data" / "nd"
PP_MICROBATCHES = 4
PP_FLAGS = {  # name: (Layout arguments without the pipeline, ConfigOptions of the launch)
    "pp2": ({"backend": "ddp", "schedule": "1F1B"},
            {"backend": "ddp", "num_processes": 2, "pp_size": 2, "pp_schedule": "1f1b"}),
    "pp2gpipe": ({"backend": "ddp", "schedule": "GPipe"},
                 {"backend": "ddp", "num_processes": 2, "pp_size": 2, "pp_schedule": "gpipe"}),
    "fsdp2xpp2": ({"backend": "fsdp", "dp_shard": 2, "schedule": "1F1B"},
                  {"backend": "fsdp", "num_processes": 4, "pp_size": 2, "pp_schedule": "1f1b"}),
}
for _, _options in PP_FLAGS.values():
    _options["microbatches"] = PP_MICROBATCHES
PP_LAUNCH = """
import json, sys
from accelkit.configs import ConfigOptions
from accelkit.launch.launch_plan import LaunchTarget
from accelkit.launch.request import LaunchRequest
from accelkit.launch.supervised import run_request
options, script, *args = json.loads(sys.argv[1]), *sys.argv[2:]
probes = ("pp_states_probe", "pp_activations_probe")
sys.exit(run_request(LaunchRequest(target=LaunchTarget(script, tuple(args)), cpu=True,
                                   options=ConfigOptions(**options), probes=probes)))
"""
PP_SEQ, PP_BATCH = 16, 4  # per data-parallel rank: 4 micro-batches of one sequence
PP_ARGS = ("--max-steps", "1", "--block-size", str(PP_SEQ), "--per-device-batch-size", str(PP_BATCH),
           "--log-every", "1")


def run_pp(names: list[str], folder: Path) -> list[tuple[str, list[dict], str]]:
    """(name, every rank's measured states with its peak saved activations, the launch's last lines when it failed)
    per pipeline layout."""
    import os

    from accelkit.ranks.probes import read_results

    results = []
    for name in names:
        work = folder / name
        work.mkdir(parents=True)
        env = {**os.environ, "ACCELKIT_PROBE_DIR": str(work), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
               "PYTHONPATH": os.pathsep.join(filter(None, (str(PP_PROBE_DIR), os.environ.get("PYTHONPATH"))))}
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", PP_LAUNCH, json.dumps(PP_FLAGS[name][1]), str(TEMPLATE),
                               *PP_ARGS, "--output-dir", str(work / "out")], capture_output=True, text=True,
                              cwd=work, env=env, timeout=900)
        print(f"  measured pipeline {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        ranks = read_results(work, "pp_states")
        peaks = {r["rank"]: r for r in read_results(work, "pp_activations")}
        for r in ranks:
            r["activations"] = peaks.get(r["rank"], {}).get("peak")
            r["saved"] = peaks.get(r["rank"], {}).get("peak_saved")
            r["outputs_held"] = peaks.get(r["rank"], {}).get("outputs_held", 0)
        if (proc.returncode != 0 or len(ranks) != PP_FLAGS[name][1]["num_processes"]
                or any(r["activations"] is None for r in ranks)):
            results.append((name, [], " / ".join(proc.stderr.strip().splitlines()[-2:]) or "failed"))
            continue
        results.append((name, ranks, ""))
    return results


TEMPLATE_SIZES = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "intermediate": 128}  # its LlamaConfig


def template_vocab() -> int:
    """The causal-lm template's vocabulary: its byte-level tokenizer's."""
    sys.path.insert(0, str(TEMPLATE.parent))
    import train  # the template itself

    return len(train.byte_level_tokenizer())


def template_model():
    """The causal-lm template's default model for nd."""
    from accelkit.plan import nd

    return nd.Model.llama(vocab=template_vocab(), **TEMPLATE_SIZES)


def template_profile(micro_batch: int):
    """The plan's activation profile of the template's model (accelkit/plan/activations/profile.py): traced with
    and without checkpointing on the meta device, fp32 as the template's pipeline runs on CPU."""
    from transformers import LlamaConfig

    from accelkit.plan.activations.profile import traced
    from accelkit.plan.models import ModelSpec, hf_build, hf_inputs, hf_step
    from accelkit.plan.planner import compute_for

    sizes = TEMPLATE_SIZES
    config = LlamaConfig(vocab_size=template_vocab(), hidden_size=sizes["hidden"],
                         intermediate_size=sizes["intermediate"], num_hidden_layers=sizes["layers"],
                         num_attention_heads=sizes["heads"], num_key_value_heads=sizes["kv_heads"],
                         max_position_embeddings=PP_SEQ)
    spec = ModelSpec(label="causal-lm template", build=hf_build(config), inputs=hf_inputs, step=hf_step)
    return traced(spec, compute_for("torch", "fp32"), micro_batch, PP_SEQ, "cpu")


def print_pp(results: list[tuple[str, list[dict], str]]) -> tuple[float, float]:
    """The pipeline table; returns the worst model-state and activation errors of its measured rows."""
    from accelkit.configs import Mesh
    from accelkit.plan import nd

    model = template_model()
    micro_batch = PP_BATCH // PP_MICROBATCHES
    profile = template_profile(micro_batch)
    print()
    print(f"Pipeline layouts, the causal-lm template's {model.parameters:,}-parameter Llama, {PP_MICROBATCHES} "
          f"micro-batches of {micro_batch} x {PP_SEQ} tokens, CPU ranks over gloo, fp32, one optimizer step. Model "
          f"states (parameters + gradients + AdamW moments) and activations (the peak bytes of tensors saved for "
          f"the backward and of the stage outputs torch caches until their backward, alive at once during the step) "
          f"per pipeline rank, the largest over its data-parallel ranks, vs the plan's (activations: its in-flight "
          f"figure from the traced profile, {profile.layer:,} B a layer, {profile.rest:,} B outside the layers, "
          f"and the cached stage outputs); pipeline rank 0 / rank 1:")
    header = (f"{'layout':48} {'N':>2} | {'measured states per rank':>24} | {'planned states per rank':>24} || "
              f"{'measured act. per rank':>24} | {'planned act. per rank':>22} | {'error per rank':>16}")
    print(header)
    print("-" * len(header))
    worst_states = worst_act = 0.0
    held, saved = {}, {}
    for name, ranks, failure in results:
        arguments = dict(PP_FLAGS[name][0])
        backend, schedule = arguments.pop("backend"), arguments.pop("schedule")
        layout = nd.Layout(backend, Mesh(pp=2, **arguments), schedule=schedule, microbatches=PP_MICROBATCHES)
        # every pipeline rank's row, not only the worst one row() returns (the function it takes the worst of):
        # no GPU limit, no checkpointing (the template's pipeline runs none), AdamW, fp32 compute and reduction
        planned = [nd._rank_row(layout, model, stage, None, PP_SEQ, micro_batch, False, "adamw", nd.LLAMA_TP_PLAN,
                                profile, 4, 4) for stage in range(layout.mesh.pp)]
        planned_act = [r.activations for r in planned]
        if not ranks:
            print(f"{layout.describe():48} {layout.world:>2} | {'-':>24} | {'not run':>24} || {failure}")
            continue
        inner = layout.world // layout.mesh.pp  # the mesh is (pp, dp_shard, tp): a pipeline rank's ranks are adjacent
        per_stage = [max(sum(r["states"].values()) for r in ranks if r["rank"] // inner == stage)
                     for stage in range(layout.mesh.pp)]
        measured_act = [max(r["activations"] for r in ranks if r["rank"] // inner == stage)
                        for stage in range(layout.mesh.pp)]
        state_errors = [(r.states - seen) / seen for r, seen in zip(planned, per_stage, strict=True)]
        worst_states = max(worst_states, *(abs(e) for e in state_errors))
        act_errors = [(plan - seen) / seen for plan, seen in zip(planned_act, measured_act, strict=True)]
        worst_act = max(worst_act, *(abs(e) for e in act_errors))
        held[layout.describe()] = max(r["outputs_held"] for r in ranks)
        saved[layout.describe()] = [max(r["saved"] for r in ranks if r["rank"] // inner == stage)
                                    for stage in range(layout.mesh.pp)]
        print(f"{layout.describe():48} {layout.world:>2} | {' / '.join(f'{v:,}' for v in per_stage):>24} | "
              f"{' / '.join(f'{r.states:,} ({e:+.1%})' for r, e in zip(planned, state_errors, strict=True)):>24} || "
              f"{' / '.join(f'{v:,}' for v in measured_act):>24} | {' / '.join(f'{v:,}' for v in planned_act):>22} | "
              f"{' / '.join(f'{e:+.1%}' for e in act_errors):>16}")
    if held:
        print("Of the measured activations, the tensors saved for the backward alone (peak, rank 0 / rank 1; the "
              "rest are the stage outputs fwd_cache holds): "
              + "; ".join(f"{name} {' / '.join(f'{v:,}' for v in value)}" for name, value in saved.items()))
        print("The last stage's outputs (logits) the schedule still holds when step() returns (torch keeps them to "
              "merge unless given return_outputs=False, which the template passes): "
              + "; ".join(f"{name} {value:,}" for name, value in held.items()))
    return worst_states, worst_act


def mesh_sizes(arguments: dict) -> dict:
    """A layout's mesh sizes from ND_FLAGS / PP_FLAGS arguments (all but the backend)."""
    return {key: value for key, value in arguments.items() if key != "backend"}


def save_tiny_llama(folder: Path) -> None:
    code = ("import torch; from transformers import LlamaConfig, LlamaForCausalLM; torch.manual_seed(0); "
            f"c = LlamaConfig(vocab_size={ND_TINY['vocab']}, hidden_size={ND_TINY['hidden']}, "
            f"intermediate_size={ND_TINY['intermediate']}, num_hidden_layers={ND_TINY['layers']}, "
            f"num_attention_heads={ND_TINY['heads']}, num_key_value_heads={ND_TINY['kv_heads']}, "
            f"max_position_embeddings=64); LlamaForCausalLM(c).save_pretrained({str(folder)!r})")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)


def run_nd(names: list[str], folder: Path) -> list[tuple[str, dict | None, str]]:
    """(name, rank 0's measured state bytes or None, launch's last line when it refused) per N-D layout."""
    save_tiny_llama(folder / "base")
    results = []
    for name in names:
        work = folder / name
        work.mkdir()
        shutil.copytree(folder / "base", work / "base")
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "accelkit", "launch", "--cpu", *ND_FLAGS[name][1],
                               str(ND_SCRIPT), str(work)], capture_output=True, text=True, cwd=work)
        print(f"  measured N-D {name} in {time.perf_counter() - start:.0f} s", file=sys.stderr)
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
            results.append((name, None, (lines or proc.stderr.strip().splitlines() or ["failed"])[-1]))
            continue
        results.append((name, json.loads((work / "result.json").read_text())["state_bytes"], ""))
    return results


def print_published() -> None:
    """The pipeline rows checked on paper against published runs (accelkit/plan/published.py)."""
    from accelkit.configs import Mesh
    from accelkit.plan import nd
    from accelkit.plan.published import TORCHTITAN_405B, gpt3_175b, torchtitan_405b

    print("Pipeline rows on paper: torchtitan's Llama 3.1 405B, 512 H100, FSDP 8 x TP 8 x PP 8, local batch 32 x "
          "8,192 tokens, full checkpointing (GiB a GPU needs, planned total + headroom, vs published peak):")
    for schedule in TORCHTITAN_405B:
        planned, published = torchtitan_405b(schedule)
        print(f"  {schedule:16} planned {planned:6.1f}  published {published:6.1f}  "
              f"({(planned - published) / published:+.1%})")
    model = gpt3_175b()
    layout = nd.Layout("ddp", Mesh(pp=8, dp_replicate=64, tp=8), schedule="1F1B", microbatches=8)
    row = nd.row(layout, model, gpus=4096, nodes=512, gpu_memory=None, seq_len=2048)
    print(f"  GPT-3 175B as 64 x 8 x 8 on 4,096 GPUs: {model.parameters / 1e9:.1f}B parameters, "
          f"{[len(r) for r in layout.pipeline.layers_of_stage(model.layers)][0]} layers a stage, model states "
          f"{row.states / 2**30:.1f} GiB on the embeddings' stage (rank {row.worst_rank})")


def print_nd(results: list[tuple[str, dict | None, str]]) -> float:
    """The N-D table; returns the worst model-state error of its measured rows."""
    from accelkit.configs import Mesh
    from accelkit.plan import nd
    from accelkit.plan.nd_report import tp_plan_of

    model, plan = nd.Model.llama(**ND_TINY), tp_plan_of("LlamaForCausalLM")  # the installed transformers' TP plan
    print()
    print(f"N-D layouts: model states on rank 0 (bytes: parameters + gradients + AdamW moments, fp32), planned vs "
          f"measured after one optimizer step, tiny Llama ({model.parameters:,} parameters), CPU ranks over gloo:")
    header = f"{'layout':36} {'N':>2} | {'measured states':>15} | {'accelkit plan':>21}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    for name, measured, refusal in results:
        layout = nd.Layout(ND_FLAGS[name][0]["backend"], Mesh(**mesh_sizes(ND_FLAGS[name][0])))
        planned = nd.row(layout, model, gpus=layout.world, nodes=1, gpu_memory=None, seq_len=16, tp_plan=plan).states
        if measured is None:
            print(f"{layout.describe():36} {layout.world:>2} | {'-':>15} | {planned:>10,} (not run)  {refusal}")
            continue
        total = sum(measured.values())
        worst = max(worst, abs(planned - total) / total)
        error = (planned - total) / total
        print(f"{layout.describe():36} {layout.world:>2} | {total:>15,} | {planned:>10,} ({error:+7.1%})")
    return worst


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
    parser.add_argument("--ranks", default="2,4",
                        help="world sizes to measure (comma-separated; '' for the N-D rows alone)")
    parser.add_argument("--nd-layouts", default=",".join(ND_FLAGS),
                        help=f"N-D layouts to measure (comma-separated: {', '.join(ND_FLAGS)}; '' for none)")
    parser.add_argument("--pp-layouts", default=",".join(PP_FLAGS),
                        help=f"pipeline layouts to measure (comma-separated: {', '.join(PP_FLAGS)}; '' for none)")
    args = parser.parse_args()
    pp_names = [name for name in args.pp_layouts.split(",") if name]
    if sorted(set(pp_names) - set(PP_FLAGS)):
        parser.error(f"unknown pipeline layout(s) {', '.join(sorted(set(pp_names) - set(PP_FLAGS)))}: choose from "
                     f"{', '.join(PP_FLAGS)}")
    ranks = [int(r) for r in args.ranks.split(",") if r]  # --ranks "" measures the N-D rows alone
    nd_names = [name for name in args.nd_layouts.split(",") if name]
    unknown = sorted(set(nd_names) - set(ND_FLAGS))
    if unknown:
        parser.error(f"unknown N-D layout(s) {', '.join(unknown)}: choose from {', '.join(ND_FLAGS)}")

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
        if nd_names:
            (Path(folder) / "nd").mkdir()
        nd_results = run_nd(nd_names, Path(folder) / "nd") if nd_names else []
        pp_results = run_pp(pp_names, Path(folder) / "pp") if pp_names else []

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
    worst_states = worst_act = 0.0
    if rows:  # --ranks '' measures the N-D rows alone
        print("Model states and activations per GPU (bytes, the rank holding the most), planned vs measured after one "
              "optimizer step on CPU ranks (bf16 mixed, AdamW, two optimizer groups):")
        print(header)
        print("-" * len(header))
        for (name, strat, world), row in sorted(rows.items(), key=lambda kv: (kv[0][2], kv[0][0], kv[0][1])):
            peer = peers(name, world)
            measured_act, plan_act, formula, _, _ = row["act"]
            worst_states = max(worst_states, row["state_error"])
            worst_act = max(worst_act, abs(plan_act - measured_act) / measured_act)
            print(f"{name:6} {strat:13} {world:>2} | {row['measured']:>15,} | {err(row['planned'], row['measured'])} | "
                  f"{err(peer.get(strat), row['measured']):>22} | {err(peer['accelerate'], row['measured'])} || "
                  f"{measured_act:>13,} | {err(plan_act, measured_act)} | {err(formula, measured_act)}")
        print("DeepSpeed's estimators cover model states of ZeRO-2/3 only (x1.5 buffer factor); accelerate "
              "estimate-memory has one figure per model (no ranks, no activations, no batch).")
    if nd_results:
        worst_states = max(worst_states, print_nd(nd_results))
    if pp_results:
        pp_states, pp_act = print_pp(pp_results)
        worst_states, worst_act = max(worst_states, pp_states), max(worst_act, pp_act)
    print_published()
    print(f"worst error: model states {worst_states * 100:.2f}%, activations {worst_act * 100:.2f}%")


if __name__ == "__main__":
    main()
