"""GPU truth: one command that checks what accelkit says about GPUs against a real GPU (issue 24).

    python benchmarks/gpu_truth.py                      # on a machine with >= 1 CUDA GPU: every section
    python benchmarks/gpu_truth.py --sections plan,nccl  # some sections
    python benchmarks/gpu_truth.py --cpu-plumbing        # no GPU: the same harness on CPU (the test suite runs this)
    python benchmarks/gpu_truth.py --format RESULT.json  # print the table of a result file

Sections (each writes rows into one JSON file, `--out`, default gpu_truth.json, and prints a table):

- plan:      `accelkit plan` (its `plan_memory`, the plan's JSON) against the CUDA caching allocator: a grid of
             models built from configs (Llama tiny..~3B, BERT, ViT, a Mixtral-style MoE), sequence lengths,
             micro-batches, fp32 / bf16-mixed / fp16 with a GradScaler, activation checkpointing, AdamW / SGD, under
             one device, FSDP2 and ZeRO-2/3 with world size 1. Each case trains 3 steps in a fresh process; planned
             peak vs torch.cuda.max_memory_allocated() and max_memory_reserved(), error in %. Boundary: with the
             process limited to a fraction of the GPU (set_per_process_memory_fraction), the largest micro-batch
             plan says fits must run and the next one, which plan says does not, must OOM (caught).
- templates: every template scaffolded (`accelkit init`), trained through `accelkit launch` (single, FSDP2, DeepSpeed,
             one process, bf16), its last checkpoint merged (`accelkit merge-ckpt`) and loaded back: equal to the
             trained weights (outputs/final) tensor for tensor.
- bench:     `accelkit bench` on one GPU: step time, tokens/s, MFU against the device's peak, data-wait share.
- nccl:      one process: NCCL init, an all-reduce, the flight-recorder environment `accelkit launch` sets (CPU
             plumbing: two gloo ranks, as the DDP rehearsal needs).
- scaling:   with two or more GPUs: `accelkit bench` over 1..N processes, and `--comm` bus bandwidth.
- checkpoint: the causal-lm template's checkpoint stall on one process (benchmarks/checkpoint_stall.py), synchronous
             against `--async-checkpoint` (staged to pinned memory on a GPU): how long the loop is blocked at a save,
             how much slower the next step is, whether it started before the files were written.

Nothing is ever claimed that was not measured: every figure is stored with the device it was measured on; in
`--cpu-plumbing` mode the same code paths run on CPU (gloo instead of NCCL, the CPU backend for launches), every GPU
figure is null, the file says `"gpu_figures": false`, and the table prints "not measured" for them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEMA = "accelkit-gpu-truth/1"
SECTIONS = ("plan", "templates", "bench", "nccl", "scaling", "checkpoint")
TEMPLATES = ("minimal", "causal-lm", "image-classification", "seq-classification")
# Dense bf16 tensor-core peak (FLOP/s) by device name, for MFU (NVIDIA data sheets; SXM parts).
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10": 125e12, "L4": 121e12}
MODELS = {
    "llama-tiny": ("llama", dict(vocab_size=32000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                                 num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=4096)),
    "llama-160m": ("llama", dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                                 num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=4096)),
    "llama-1b": ("llama", dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                               num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=4096)),
    "llama-3b": ("llama", dict(vocab_size=32000, hidden_size=3200, intermediate_size=8640, num_hidden_layers=26,
                               num_attention_heads=32, num_key_value_heads=32, max_position_embeddings=4096)),
    "bert-base": ("bert", {}),
    "vit-base": ("vit", {}),
    "mixtral-moe": ("mixtral", dict(vocab_size=32000, hidden_size=1024, intermediate_size=2048, num_hidden_layers=8,
                                    num_attention_heads=16, num_key_value_heads=8, num_local_experts=8,
                                    num_experts_per_tok=2, max_position_embeddings=4096)),
}
BASE = dict(precision="bf16-mixed", optimizer="adamw", seq_len=512, micro_batch=2, ac=False, strategy="single")


def plan_cases(cpu: bool) -> list[dict]:
    """The grid: a base case per model, then one change at a time on two Llama sizes (strategies, precisions,
    activation checkpointing, optimizer, sequence length, micro-batch)."""
    if cpu:  # plumbing: one tiny case per code path that runs on CPU (no fp16 scaler, no NCCL)
        return [{**BASE, "model": "llama-tiny", "seq_len": 64, "precision": "fp32"},
                {**BASE, "model": "llama-tiny", "seq_len": 64, "precision": "fp32", "strategy": "fsdp2", "ac": True}]
    cases = [{**BASE, "model": name} for name in MODELS]
    for model in ("llama-160m", "llama-1b"):
        for change in (dict(precision="fp32"), dict(precision="fp16-mixed"), dict(ac=True), dict(optimizer="sgd"),
                       dict(seq_len=2048), dict(micro_batch=8), dict(strategy="fsdp2"), dict(strategy="zero2"),
                       dict(strategy="zero3"), dict(strategy="fsdp2", ac=True, seq_len=2048)):
            cases.append({**BASE, "model": model, **change})
    return cases


# -- plan (in-process, public API) ----------------------------------------------------------------------------------
PLAN_STRATEGY = {"single": "single", "fsdp2": "fsdp-full", "zero2": "zero2", "zero3": "zero3"}


def model_dir(name: str, root: Path) -> Path:
    """A folder holding the model's config.json (built from the config class; nothing is downloaded)."""
    folder = root / name
    if not (folder / "config.json").is_file():
        import transformers

        kind, overrides = MODELS[name]
        config_class = {"llama": transformers.LlamaConfig, "bert": transformers.BertConfig,
                        "vit": transformers.ViTConfig, "mixtral": transformers.MixtralConfig}[kind]
        config_class(**overrides).save_pretrained(folder)
    return folder


def planned(case: dict, folder: Path, gpu_memory: int) -> dict:
    """Plan's peak per GPU for the case's strategy, and its fit verdict, from `plan_memory`'s JSON."""
    from accelkit.plan.api import PlanRequest, plan_memory

    text_model = MODELS[case["model"]][0] != "vit"
    result = plan_memory(PlanRequest(
        model=str(folder), gpus=1, gpu_memory=f"{gpu_memory}B", precision=case["precision"],
        optimizer={"sgd": "sgd-momentum"}.get(case["optimizer"], case["optimizer"]),
        seq_len=case["seq_len"] if text_model else None, micro_batch=case["micro_batch"],
        activation_checkpointing=case["ac"], command_line="gpu_truth"))
    row = next(r for r in result.json["strategies"] if r["name"] == PLAN_STRATEGY[case["strategy"]])
    return {"planned_bytes": row["per_gpu_bytes"]["total"], "plan_fits": bool(row["fits"]) or (
        not row["applicable"] and row["usable_gpu_bytes"] >= row["per_gpu_bytes"]["total"]),
        "plan_applicable": row["applicable"]}


# -- one training case in a fresh process ---------------------------------------------------------------------------
def run_worker(case: dict, device: str, folder: Path, memory_fraction: float | None = None,
               timeout: float = 900) -> dict:
    payload = json.dumps({"case": case, "device": device, "folder": str(folder), "fraction": memory_fraction})
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
           "WORLD_SIZE": "1", "LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu" if device == "cpu" else "cuda"}
    try:
        proc = subprocess.run([sys.executable, __file__, "--worker", payload], capture_output=True, text=True,
                              env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"the case took longer than {timeout:.0f} s"}
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1][:300]}
    return json.loads(lines[-1])


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _inputs(kind: str, case: dict, device):
    import torch

    mb, seq = case["micro_batch"], case["seq_len"]
    if kind == "vit":
        return {"pixel_values": torch.randn(mb, 3, 224, 224, device=device), "labels": torch.randint(0, 2, (mb,),
                                                                                                    device=device)}
    ids = torch.randint(0, 1000, (mb, seq), device=device)
    return {"input_ids": ids, "labels": ids}


def worker(payload: dict) -> None:
    """Runs in its own process: build the case's model, train 3 steps, print the allocator's peaks as JSON."""
    import torch
    import transformers

    case, device = payload["case"], torch.device(payload["device"])
    kind = MODELS[case["model"]][0]
    config = transformers.AutoConfig.from_pretrained(payload["folder"])
    model_class = {"llama": transformers.LlamaForCausalLM, "mixtral": transformers.MixtralForCausalLM,
                   "bert": transformers.BertForMaskedLM, "vit": transformers.ViTForImageClassification}[kind]
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(0)
        if payload["fraction"]:
            torch.cuda.set_per_process_memory_fraction(payload["fraction"])
        torch.cuda.reset_peak_memory_stats()
    try:
        step_s = _train(case, kind, model_class, config, device)
    except torch.cuda.OutOfMemoryError as exc:
        print(json.dumps({"oom": True, "message": str(exc).splitlines()[0][:200]}))
        return
    out = {"oom": False, "step_s": step_s, "measured_on": torch.cuda.get_device_name(0) if cuda else None,
           "allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
           "reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None}
    print(json.dumps(out))


def _train(case: dict, kind: str, model_class, config, device) -> float:
    import torch

    strategy, precision = case["strategy"], case["precision"]
    model = model_class(config).to(device)
    if case["ac"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    make_optimizer = (lambda p: torch.optim.AdamW(p, lr=1e-4)) if case["optimizer"] == "adamw" else (
        lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0.9))
    half = {"bf16-mixed": torch.bfloat16, "fp16-mixed": torch.float16}.get(precision)
    if strategy.startswith("zero"):
        import deepspeed

        deepspeed.init_distributed(dist_backend="nccl" if device.type == "cuda" else "gloo")
        ds_config = {"train_micro_batch_size_per_gpu": case["micro_batch"], "zero_allow_untested_optimizer": True,
                     "zero_optimization": {"stage": int(strategy[-1])},
                     "bf16": {"enabled": precision == "bf16-mixed"}, "fp16": {"enabled": precision == "fp16-mixed"}}
        engine, *_ = deepspeed.initialize(model=model, optimizer=make_optimizer(model.parameters()), config=ds_config)
        step = lambda batch: (engine.backward(engine(**batch).loss), engine.step())  # noqa: E731
    else:
        if strategy == "fsdp2":
            import torch.distributed as dist
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            policy = MixedPrecisionPolicy(param_dtype=half, reduce_dtype=torch.float32) if half else \
                MixedPrecisionPolicy()
            for layer in _layers(model, kind):
                fully_shard(layer, mp_policy=policy)
            fully_shard(model, mp_policy=policy)
        optimizer = make_optimizer(model.parameters())
        scaler = torch.amp.GradScaler(device.type) if precision == "fp16-mixed" else None
        autocast = half is not None and strategy != "fsdp2"

        def step(batch):
            with torch.autocast(device.type, dtype=half or torch.float32, enabled=autocast):
                loss = model(**batch).loss
            if scaler:
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
            else:
                loss.backward()
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    times = []
    for _ in range(3):
        batch = _inputs(kind, case, device)
        began = time.perf_counter()
        step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - began)
    return min(times)


def _layers(model, kind: str) -> list:
    if kind == "bert":
        return list(model.bert.encoder.layer)
    if kind == "vit":
        return list(model.vit.encoder.layer)
    return list(model.model.layers)


def section_plan(cpu: bool, root: Path, device_memory: int | None) -> list[dict]:
    rows = []
    budget = device_memory or 80 * 10**9  # CPU plumbing: plan for an 80 GB device, nothing is measured against it
    for case in plan_cases(cpu):
        folder = model_dir(case["model"], root)
        row = dict(case)
        try:
            row.update(planned(case, folder, budget))
        except Exception as exc:  # noqa: BLE001 - a case plan refuses is a row, not the end of the run
            row["error"] = f"plan: {type(exc).__name__}: {exc}"[:300]
            rows.append(row)
            continue
        row.update(run_worker(case, "cpu" if cpu else "cuda", folder))
        if row.get("allocated_bytes"):
            row["error_allocated_pct"] = 100 * (row["planned_bytes"] - row["allocated_bytes"]) / row["allocated_bytes"]
            row["error_reserved_pct"] = 100 * (row["planned_bytes"] - row["reserved_bytes"]) / row["reserved_bytes"]
        rows.append(row)
        print(f"  plan {case['model']} {case['strategy']} {case['precision']}: {_short(row)}", file=sys.stderr)
    if not cpu and device_memory:
        rows += boundary(root, device_memory)
    return rows


def boundary(root: Path, device_memory: int, fraction: float = 0.25) -> list[dict]:
    """With the process limited to `fraction` of the GPU: the largest micro-batch plan says fits must run, the next
    (which plan says does not fit) must run out of memory."""
    rows = []
    for model in ("llama-160m", "llama-1b"):
        folder = model_dir(model, root)
        budget = int(device_memory * fraction)
        verdicts = {}
        for mb in (1, 2, 4, 8, 16, 32, 64, 128):
            verdicts[mb] = planned({**BASE, "model": model, "micro_batch": mb}, folder, budget)["plan_fits"]
        fitting = [mb for mb, fits in verdicts.items() if fits]
        failing = [mb for mb, fits in verdicts.items() if not fits]
        if not fitting or not failing:
            rows.append({"model": model, "boundary": True, "note": "no boundary within micro-batch 1..128"})
            continue
        for mb, expect_run in ((max(fitting), True), (min(failing), False)):
            case = {**BASE, "model": model, "micro_batch": mb}
            result = run_worker(case, "cuda", folder, memory_fraction=fraction)
            ran = result.get("oom") is False
            rows.append({**case, "boundary": True, "budget_bytes": budget, "plan_fits": expect_run, "ran": ran,
                         "verdict_holds": ran == expect_run and "error" not in result, **result})
    return rows


def _short(row: dict) -> str:
    if row.get("error"):
        return f"error: {row['error']}"
    if row.get("allocated_bytes") is None:
        return f"planned {row['planned_bytes'] / 2**30:.2f} GiB, ran (no GPU figure)"
    return f"planned {row['planned_bytes'] / 2**30:.2f} GiB, allocated {row['allocated_bytes'] / 2**30:.2f} GiB"


# -- templates, bench, nccl, scaling (through the accelkit CLI) ----------------------------------------------------
def accelkit(*args: str, timeout: float = 900, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "accelkit", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


def section_templates(cpu: bool, root: Path) -> list[dict]:
    rows = []
    plans = [("minimal", "cpu")] if cpu else [(t, b) for t in TEMPLATES for b in ("single", "fsdp", "deepspeed")]
    for template, backend in plans:
        folder = root / f"t-{template}-{backend}"
        shutil.rmtree(folder, ignore_errors=True)
        row = {"template": template, "backend": backend, "device": "cpu" if cpu else "cuda"}
        steps = ["init", "launch", "merge", "compare"]
        done = accelkit("init", str(folder), "-t", template, "--backend", backend, "--num-processes", "1")
        if done.returncode == 0:
            launch = ["launch", "--backend", backend, "--num-processes", "1"]
            launch += ["--cpu"] if cpu else ["--mixed-precision", "bf16"]
            done = accelkit(*launch, str(folder / "train.py"), "--", "--max-steps", "2", "--checkpoint-every", "2")
            steps.pop(0)
        if done.returncode == 0:
            done = accelkit("merge-ckpt", str(folder / "outputs" / "checkpoint-2"), "-o", str(folder / "merged"),
                            "-q")
            steps.pop(0)
        if done.returncode == 0:
            steps.pop(0)
            row["equal_tensors"], row["mismatch"] = compare_weights(folder / "merged", folder / "outputs" / "final")
            row["ok"] = row["mismatch"] is None
        else:
            row["ok"], row["failed_at"] = False, steps[0]
            row["error"] = next((line for line in done.stderr.splitlines() if line.startswith("Error:")),
                                done.stderr.strip()[-300:])
        rows.append(row)
        print(f"  template {template} {backend}: {'ok' if row['ok'] else row.get('error')}", file=sys.stderr)
    return rows


def section_checkpoint(cpu: bool, root: Path) -> list[dict]:
    """Sync against async checkpoint stall, one process (a Llama of ~1.3 GB of checkpoint on a GPU, a small one on
    CPU), with the measurement of benchmarks/checkpoint_stall.py."""
    import importlib.util
    import statistics

    spec = importlib.util.spec_from_file_location("checkpoint_stall", Path(__file__).with_name("checkpoint_stall.py"))
    stall = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(stall)
    from accelkit.scaffold import init_project

    folder = root / "checkpoint-stall"
    shutil.rmtree(folder, ignore_errors=True)
    project = init_project(folder / "proj", "causal-lm", backend="single").directory
    stall.make_model(folder / "model", *((128, 2) if cpu else (1024, 8)))
    rows = []
    for mode in ("sync", "async"):
        found = stall.run(project, folder / "model", 1, mode == "async", folder / mode)
        rows.append({"mode": mode, "device": "cpu" if cpu else "cuda", "checkpoint_bytes": found["size"],
                     "plain_step_s": found["step"], "blocked_s": statistics.median(found["blocked"]),
                     "next_step_slower_s": statistics.median(found["slower"]),
                     "started_before_written": f"{found['early']}/{found['saves']}"})
    return rows


def compare_weights(merged: Path, final: Path) -> tuple[int, str | None]:
    """Every tensor of the merged checkpoint equals the trained model's (tied aliases may be stored once)."""
    import torch
    from safetensors.torch import load_file

    def load(folder: Path) -> dict:
        out = {}
        for file in sorted(folder.glob("*.safetensors")):
            out.update(load_file(file))
        return out

    ours, theirs = load(merged), load(final)
    for name, tensor in ours.items():
        if name not in theirs:
            return 0, f"{name} is not in {final}"
        if not torch.equal(tensor, theirs[name].to(tensor.dtype)):
            return 0, f"{name} differs"
    missing = set(theirs) - set(ours)
    if missing and not all(any(torch.equal(theirs[m], t) for t in ours.values()) for m in missing):
        return 0, f"{sorted(missing)[0]} is missing from the merge"
    return len(ours), None


def section_bench(cpu: bool, root: Path, peak_flops: float | None) -> list[dict]:
    folder = root / "bench-causal-lm"
    shutil.rmtree(folder, ignore_errors=True)
    made = accelkit("init", str(folder), "-t", "causal-lm", "--backend", "cpu" if cpu else "single",
                    "--num-processes", "1")
    if made.returncode != 0:
        return [{"error": made.stderr.strip()[-300:]}]
    args = ["bench", "--num-processes", "1", "--steps", "3" if cpu else "30", "--warmup", "1" if cpu else "5",
            "-o", str(folder / "bench"), "--force"]
    args += ["--cpu", "--backend", "cpu"] if cpu else ["--backend", "single", "--mixed-precision", "bf16"]
    done = accelkit(*args, str(folder / "train.py"))
    try:
        run = json.loads((folder / "bench" / "bench.json").read_text())["runs"][0]
    except (OSError, ValueError, KeyError, IndexError):
        return [{"error": (done.stderr.strip().splitlines() or ["no bench.json"])[-1][:300]}]
    params = _parameters(folder)
    row = {"device": "cpu" if cpu else "cuda", "status": run.get("status"),
           "step_time_s": (run.get("step_time_s") or {}).get("median"), "tokens_per_s": run.get("tokens_per_s"),
           "data_wait_share": run.get("data_wait_share"), "parameters": params, "mfu": None}
    if not cpu and peak_flops and row["tokens_per_s"] and params:
        row["mfu"] = 6 * params * row["tokens_per_s"] / peak_flops  # 6N FLOPs per token (forward + backward)
    return [row]


def _parameters(project: Path) -> int | None:
    from accelkit.plan.api import PlanRequest, plan_memory

    try:
        result = plan_memory(PlanRequest(model=str(project), gpus=1, gpu_memory="80GB", command_line="gpu_truth"))
    except Exception:  # noqa: BLE001 - the bench row stands without MFU
        return None
    return result.json["model"]["parameters"]


NCCL_SCRIPT = """
import json, os, torch, torch.distributed as dist
cuda = torch.cuda.is_available() and os.environ.get("GPU_TRUTH_CPU") != "1"
dist.init_process_group("nccl" if cuda else "gloo")
x = torch.ones(1 << 20, device="cuda" if cuda else "cpu")
dist.all_reduce(x)
ok = bool((x == dist.get_world_size()).all())
env = {k: os.environ.get(k) for k in ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE",
                                      "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_DESYNC_DEBUG")}
if dist.get_rank() == 0:
    print("GPU_TRUTH " + json.dumps({"backend": dist.get_backend(), "all_reduce_ok": ok, "env": env,
                                     "nccl_version": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None}))
dist.destroy_process_group()
"""


def section_nccl(cpu: bool, root: Path) -> list[dict]:
    script = root / "nccl_check.py"
    script.write_text(NCCL_SCRIPT)
    # One process on the GPU; the CPU rehearsal of DDP needs two gloo ranks (the same script, the same checks).
    launch = ["launch", "--backend", "ddp"] + (["--cpu", "--num-processes", "2"] if cpu else ["--num-processes", "1"])
    os.environ["GPU_TRUTH_CPU"] = "1" if cpu else "0"
    done = accelkit(*launch, str(script))
    found = [line.split("GPU_TRUTH ", 1)[1] for line in (done.stdout + done.stderr).splitlines()
             if "GPU_TRUTH {" in line]
    if not found:
        return [{"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1][:300]}]
    row = json.loads(found[-1])
    row["flight_recorder_env"] = bool(row["env"].get("TORCH_NCCL_TRACE_BUFFER_SIZE"))
    return [row]


def section_scaling(gpus: int, root: Path) -> list[dict]:
    if gpus < 2:
        return [{"skipped": f"{gpus} GPU: the scaling sweep and --comm need two or more"}]
    folder = root / "scaling-causal-lm"
    shutil.rmtree(folder, ignore_errors=True)
    accelkit("init", str(folder), "-t", "causal-lm", "--backend", "ddp", "--num-processes", str(gpus))
    sizes = ",".join(str(n) for n in (1, 2, 4, 8) if n <= gpus)
    accelkit("bench", "--num-processes", sizes, "--backend", "ddp", "--mixed-precision", "bf16", "-o",
             str(folder / "bench"), "--force", str(folder / "train.py"))
    accelkit("bench", "--comm", "--num-processes", str(gpus), "-o", str(folder / "comm"), "--force")
    rows = []
    for name in ("bench", "comm"):
        try:
            rows.append({"kind": name, **json.loads((folder / name / "bench.json").read_text())})
        except (OSError, ValueError):
            rows.append({"kind": name, "error": "no bench.json"})
    return rows


# -- the result: JSON and table ---------------------------------------------------------------------------------------
def device_info(cpu: bool) -> dict:
    import torch

    if cpu or not torch.cuda.is_available():
        return {"kind": "cpu", "name": platform.processor() or platform.machine(), "gpus": 0, "memory_bytes": None}
    props = torch.cuda.get_device_properties(0)
    return {"kind": "cuda", "name": props.name, "gpus": torch.cuda.device_count(), "memory_bytes": props.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda}


def peak_for(name: str) -> float | None:
    return next((peak for key, peak in PEAK_BF16.items() if key in name), None)


def _gib(value) -> str:
    return f"{value / 2**30:.2f}" if isinstance(value, (int, float)) else "not measured"


def _pct(value) -> str:
    return f"{value:+.1f}%" if isinstance(value, (int, float)) else "-"


def format_result(result: dict) -> str:
    """The tables of a result file. GPU figures that are null print as "not measured"."""
    device = result["device"]
    lines = [f"accelkit GPU truth, {result['date']}: {device['name']} ({device['kind']}, {device['gpus']} GPU), "
             f"mode {result['mode']}" + ("" if result["gpu_figures"] else ": no GPU figure was measured")]
    if result.get("provenance"):
        lines.append(f"provenance: {result['provenance']}")
    sections = {}
    for name, rows in result["sections"].items():  # a section that failed as a whole: one row with only its error
        failed = [r for r in rows if set(r) == {"error"}]
        lines += [f"{name}: error: {r['error']}" for r in failed if name not in ("bench", "nccl")]
        sections[name] = [r for r in rows if r not in failed or name in ("bench", "nccl")]
    result = {**result, "sections": sections}
    plan = result["sections"].get("plan") or []
    if plan:
        lines += ["", "| model | strategy | precision | seq | mb | AC | optimizer | planned GiB | allocated GiB | "
                      "reserved GiB | error vs allocated | error vs reserved |", "|" + "---|" * 12]
        for r in (r for r in plan if not r.get("boundary")):
            lines.append(f"| {r['model']} | {r['strategy']} | {r['precision']} | {r['seq_len']} | {r['micro_batch']} | "
                         f"{'on' if r['ac'] else 'off'} | {r['optimizer']} | {_gib(r.get('planned_bytes'))} | "
                         f"{_gib(r.get('allocated_bytes'))} | {_gib(r.get('reserved_bytes'))} | "
                         f"{_pct(r.get('error_allocated_pct'))} | {_pct(r.get('error_reserved_pct'))} |"
                         + (f" error: {r['error']}" if r.get("error") else ""))
        bounds = [r for r in plan if r.get("boundary")]
        if bounds:
            lines += ["", "| boundary: model | micro-batch | budget GiB | plan says | ran | verdict holds |",
                      "|---|---:|---:|---|---|---|"]
            for r in bounds:
                if "note" in r:
                    lines.append(f"| {r['model']} | - | - | {r['note']} | - | - |")
                    continue
                lines.append(f"| {r['model']} | {r['micro_batch']} | {_gib(r['budget_bytes'])} | "
                             f"{'fits' if r['plan_fits'] else 'does not fit'} | {'ran' if r['ran'] else 'OOM'} | "
                             f"{'yes' if r['verdict_holds'] else 'NO'} |")
    templates = result["sections"].get("templates") or []
    if templates:
        lines += ["", "| template | backend | device | trained, merged, loaded back equal |", "|---|---|---|---|"]
        for r in templates:
            verdict = f"yes ({r['equal_tensors']} tensors)" if r.get("ok") else \
                f"NO: {r.get('mismatch') or r.get('failed_at', '')} {r.get('error', '')}".strip()
            lines.append(f"| {r['template']} | {r['backend']} | {r['device']} | {verdict} |")
    for r in result["sections"].get("bench") or []:
        if r.get("error"):
            lines += ["", f"bench: error: {r['error']}"]
            continue
        mfu = f"{100 * r['mfu']:.1f}%" if isinstance(r.get("mfu"), (int, float)) else "not measured"
        tokens = f"{r['tokens_per_s']:.0f}" if r.get("tokens_per_s") else "-"
        step = f"{1000 * r['step_time_s']:.1f} ms" if r.get("step_time_s") else "-"
        wait = f"{100 * r['data_wait_share']:.1f}%" if r.get("data_wait_share") is not None else "-"
        lines += ["", "| bench (causal-lm, 1 process) | step time | tokens/s | MFU | data wait |",
                  "|---|---:|---:|---:|---:|", f"| {r['device']} | {step} | {tokens} | {mfu} | {wait} |"]
    for r in result["sections"].get("nccl") or []:
        lines += ["", f"collectives: backend {r.get('backend')}, all-reduce ok: {r.get('all_reduce_ok')}, "
                      f"flight-recorder env: {r.get('flight_recorder_env')}, NCCL {r.get('nccl_version') or '-'}"
                  + (f", error: {r['error']}" if r.get("error") else "")]
    stalls = result["sections"].get("checkpoint") or []
    if stalls:
        lines += ["", "| checkpoint stall (causal-lm, 1 process) | device | checkpoint MB | plain step s | blocked s | "
                      "next step slower s | next step started before written |", "|---|---|---:|---:|---:|---:|---|"]
        for r in stalls:
            lines.append(f"| {r['mode']} | {r['device']} | {r['checkpoint_bytes'] / 1e6:.1f} | "
                         f"{r['plain_step_s']:.3f} | {r['blocked_s']:.3f} | {r['next_step_slower_s']:.3f} | "
                         f"{r['started_before_written']} |")
    for r in result["sections"].get("scaling") or []:
        lines += ["", f"scaling: {r.get('skipped') or r.get('error') or r.get('kind') + ' written'}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-plumbing", action="store_true", help="run the harness on CPU (no GPU figure)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--out", type=Path, default=Path("gpu_truth.json"))
    parser.add_argument("--work", type=Path, help="scratch folder (default: a temporary one, removed)")
    parser.add_argument("--format", type=Path, metavar="RESULT", help="print the tables of a result file and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker))
        return 0
    if args.format:
        print(format_result(json.loads(args.format.read_text())))
        return 0
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    cpu = args.cpu_plumbing
    device = device_info(cpu)
    if not cpu and device["kind"] != "cuda":
        print("gpu_truth: no CUDA GPU here; run with --cpu-plumbing to check the harness itself", file=sys.stderr)
        return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="accelkit-gpu-truth-"))
    work.mkdir(parents=True, exist_ok=True)
    result = {"schema": SCHEMA, "date": datetime.date.today().isoformat(), "mode": "cpu-plumbing" if cpu else "gpu",
              "gpu_figures": not cpu, "device": device, "sections": {}}
    started = time.perf_counter()
    try:
        for section in sections:
            print(f"gpu_truth: {section} ...", file=sys.stderr)
            try:
                result["sections"][section] = run_section(section, cpu, work, device)
            except Exception as exc:  # noqa: BLE001 - one broken section must not lose the others' results
                result["sections"][section] = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    result["seconds"] = round(time.perf_counter() - started, 1)
    args.out.write_text(json.dumps(result, indent=1, default=_json_default) + "\n")
    print(format_result(result))
    print(f"\nwritten: {args.out}", file=sys.stderr)
    return 0


def run_section(section: str, cpu: bool, work: Path, device: dict) -> list[dict]:
    if section == "plan":
        return section_plan(cpu, work / "models", device["memory_bytes"])
    if section == "templates":
        return section_templates(cpu, work)
    if section == "bench":
        return section_bench(cpu, work, None if cpu else peak_for(device["name"]))
    if section == "nccl":
        return section_nccl(cpu, work)
    if section == "checkpoint":
        return section_checkpoint(cpu, work)
    return section_scaling(device["gpus"], work)


def _json_default(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
