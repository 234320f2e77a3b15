"""Checkpoint stall: how long a checkpoint holds up the training loop, synchronous save (`--no-async-checkpoint`:
save_state, then the manifest) against asynchronous (`--async-checkpoint`: state staged to CPU memory, written and
hashed by a background thread), for the causal-lm template.

The template runs as users run it (a scaffolded copy, its own loop), once with one process and once under FSDP on 2
CPU ranks (`accelkit launch --cpu --backend fsdp`), on a local Llama bigger than the template's tiny default (so a
checkpoint holds tens of MB: weights plus AdamW state). This script wraps the run (`--probe`): a torch optimizer-step
hook stamps the end of every step, a global forward pre-hook the start of the next step's first forward (rank 0).
At a checkpoint step N:
- blocked: from step N's end to step N+1's first forward, minus the median of that gap at steps without a save
  (the time the loop stood still for the save);
- next step slower: step N+1's duration (end of N to end of N+1) minus the median step without a save before it
  (blocked time plus any slow-down from the background write sharing the CPU);
- started before written: step N+1's first forward began before the manifest (written last) existed.
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

    from torch.nn.modules.module import register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook

    ends: list[float] = []
    starts: list[float] = []

    def step_end(optimizer, args, kwargs) -> None:
        ends.append(time.time())

    def forward_start(module, args) -> None:
        if len(starts) < len(ends):  # the first forward after a step: the next step has started
            starts.append(time.time())

    register_optimizer_step_post_hook(step_end)
    register_module_forward_pre_hook(forward_start)
    rank = os.environ.get("RANK", "0")
    atexit.register(lambda: (out / f"rank-{rank}.json").write_text(json.dumps({"ends": ends, "starts": starts})))
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
    ends, starts = stamps["ends"], stamps["starts"]  # ends[k]: end of step k+1; starts[k]: start of step k+2
    assert len(ends) == STEPS and len(starts) >= STEPS - 1, (len(ends), len(starts))
    saves = list(range(EVERY, STEPS, EVERY))
    steps = range(2, STEPS)  # steps N with a step N+1 after them
    gap = {n: starts[n - 1] - ends[n - 1] for n in steps}  # end of step N to step N+1's first forward
    duration = {n: ends[n] - ends[n - 1] for n in steps}  # step N+1, measured from the end of step N
    plain_gap = statistics.median(gap[n] for n in steps if n not in saves)
    plain_step = statistics.median(duration[n] for n in steps if n not in saves)
    manifest = {n: (out / "run" / f"checkpoint-{n}" / "accelkit-manifest.json").stat().st_mtime for n in saves}
    return {"step": plain_step, "blocked": [gap[n] - plain_gap for n in saves],
            "slower": [duration[n] - plain_step for n in saves], "saves": len(saves),
            "early": sum(starts[n - 1] < manifest[n] for n in saves),
            "size": sum(p.stat().st_size for p in (out / "run" / f"checkpoint-{EVERY}").rglob("*") if p.is_file())}


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
              f"checkpoint every {EVERY}; {args.runs} run(s) per row; medians over the checkpoints with a next step")
        print(f"{'world':>5} {'mode':>5} {'ckpt MB':>7} {'plain step s':>12} {'blocked s':>9} "
              f"{'next step slower s':>18} {'next step started before written':>32}")
        for processes in (1, 2):
            results: dict[str, list[dict]] = {"sync": [], "async": []}
            for index in range(args.runs):
                for mode in ("sync", "async"):
                    results[mode].append(run(project, root / "model", processes, mode == "async",
                                             root / f"w{processes}-{mode}-{index}"))
            for mode, found in results.items():
                blocked = statistics.median(s for r in found for s in r["blocked"])
                slower = statistics.median(s for r in found for s in r["slower"])
                early = f"{sum(r['early'] for r in found)}/{sum(r['saves'] for r in found)}"
                print(f"{processes:>5} {mode:>5} {found[0]['size'] / 1e6:>7.1f} "
                      f"{statistics.median(r['step'] for r in found):>12.3f} {blocked:>9.3f} {slower:>18.3f} "
                      f"{early:>32}")


if __name__ == "__main__":
    main()
