"""Checkpoint stall: how much longer the optimizer step right after a checkpoint takes, synchronous save
(`--no-async-checkpoint`: save_state, manifest) against asynchronous (`--async-checkpoint`: state staged to CPU,
written and hashed by a background thread), for the causal-lm template.

The template runs as users run it (a scaffolded copy, its own loop), once with one process and once under FSDP on 2
CPU ranks (`accelkit launch --cpu --backend fsdp`), on a local Llama bigger than the template's tiny default (so a
checkpoint holds tens of MB: weights plus AdamW state). This script wraps the run (`--probe`): a torch optimizer-step
hook stamps every step on every rank. The stall at checkpoint step N is (time from step N to step N+1) minus the
median of the intervals with no checkpoint in them (rank 0). "written after next step" counts the checkpoints whose
manifest (written last) is newer than step N+1: the next step ran while the files were being written.
Runs alternate between the modes so that machine load hits both alike.

    python benchmarks/checkpoint_stall.py [--runs 2] [--hidden-size 384] [--layers 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STEPS, EVERY = 24, 6


def probe(out: Path, argv: list[str]) -> None:
    """Run the training script `argv` in this process, stamping each optimizer step (wall clock) for this rank."""
    import atexit
    import runpy

    from torch.optim.optimizer import register_optimizer_step_post_hook

    stamps: list[float] = []
    register_optimizer_step_post_hook(lambda optimizer, args, kwargs: stamps.append(time.time()))
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: (out / f"rank-{rank}.json").write_text(json.dumps(stamps)))
    sys.argv = argv
    runpy.run_path(argv[0], run_name="__main__")


def make_model(folder: Path, hidden: int, layers: int) -> None:
    import importlib.util

    from transformers import AutoModelForCausalLM, LlamaConfig

    spec = importlib.util.spec_from_file_location("causal_lm_train", REPO / "templates" / "causal-lm" / "train.py")
    template = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(template)
    tokenizer = template.byte_level_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=hidden * 3,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=64, bos_token_id=tokenizer.eos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def run(project: Path, model: Path, processes: int, asynchronous: bool, out: Path) -> dict:
    out.mkdir(parents=True)
    train = ["train.py", "--model", str(model), "--output-dir", str(out / "run"), "--max-steps", str(STEPS),
             "--checkpoint-every", str(EVERY), "--log-every", "1000", "--eval-every", "1000",
             "--per-device-batch-size", "4", "--warmup-steps", "0",
             "--async-checkpoint" if asynchronous else "--no-async-checkpoint"]
    wrapped = [str(Path(__file__).resolve()), "--probe", str(out), "--", *train]
    if processes == 1:
        argv = [sys.executable, *wrapped]
    else:
        argv = [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "fsdp", "--num-processes",
                str(processes), *wrapped]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_DATASETS_CACHE": str(out / "cache")}
    proc = subprocess.run(argv, cwd=project, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    stamps = json.loads((out / "rank-0.json").read_text())
    assert len(stamps) == STEPS, len(stamps)
    intervals = {step: stamps[step - 1] - stamps[step - 2] for step in range(2, STEPS + 1)}  # end of step-1 to step
    saves = list(range(EVERY, STEPS, EVERY))
    plain = statistics.median(v for step, v in intervals.items() if step - 1 not in saves)
    stalls = [intervals[step + 1] - plain for step in saves]
    overlapped = sum((out / "run" / f"checkpoint-{step}" / "accelkit-manifest.json").stat().st_mtime
                     > stamps[step] for step in saves)  # stamps[step] is step N+1's end (0-based list)
    size = sum(p.stat().st_size for p in (out / "run" / f"checkpoint-{EVERY}").rglob("*") if p.is_file())
    return {"step": plain, "stalls": stalls, "overlapped": overlapped, "saves": len(saves), "size": size}


def main() -> None:
    if sys.argv[1:2] == ["--probe"]:  # inside a run: --probe OUT -- train.py ARGS
        probe(Path(sys.argv[2]), sys.argv[4:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2, help="runs per mode and world size (alternating)")
    parser.add_argument("--hidden-size", type=int, default=384)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    from accelkit.scaffold import init_project

    with tempfile.TemporaryDirectory(prefix="checkpoint-stall-") as temp:
        root = Path(temp)
        project = init_project(root / "proj", "causal-lm", backend="ddp").directory
        make_model(root / "model", args.hidden_size, args.layers)
        print(f"causal-lm template, Llama hidden {args.hidden_size} x {args.layers} layers, {STEPS} steps, "
              f"checkpoint every {EVERY}; {args.runs} run(s) per row; stall = step after a save minus a plain step")
        print(f"{'world':>6} {'mode':>6} {'ckpt MB':>8} {'plain step s':>13} {'stall s (median)':>17} "
              f"{'stall s (each)':>28} {'written after next step':>24}")
        for processes in (1, 2):
            results: dict[str, list[dict]] = {"sync": [], "async": []}
            for index in range(args.runs):
                for mode in ("sync", "async"):
                    results[mode].append(run(project, root / "model", processes, mode == "async",
                                             root / f"w{processes}-{mode}-{index}"))
            for mode, found in results.items():
                stalls = [s for r in found for s in r["stalls"]]
                each = " ".join(f"{s:.3f}" for s in stalls)
                print(f"{processes:>6} {mode:>6} {found[0]['size'] / 1e6:>8.1f} "
                      f"{statistics.median(r['step'] for r in found):>13.3f} {statistics.median(stalls):>17.3f} "
                      f"{each:>28} {sum(r['overlapped'] for r in found):>17}/{sum(r['saves'] for r in found)}")


if __name__ == "__main__":
    main()
