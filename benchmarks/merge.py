"""Benchmark: merging a ~1 GB checkpoint with accelkit vs the peer tools, wall time and peak RSS side by side.

    python benchmarks/merge.py [--cache DIR] [--size-gb 1.0]

Builds (once, cached under DIR) a model of plain Linear layers, about SIZE GB of fp32 weights, and saves it with
the real tools on 2 CPU ranks: FSDP2 + torch DCP, and DeepSpeed ZeRO-2 and ZeRO-3 after one AdamW step. Then every
tool runs in a fresh process, measured by a small wrapper process (wall time, and the peak RSS of its child from
getrusage(RUSAGE_CHILDREN)):

- DCP:     accelkit merge-ckpt  vs  `accelerate merge-weights`
- ZeRO-2/3: accelkit merge-ckpt  vs  DeepSpeed's zero_to_fp32.py (the script it writes into the checkpoint)
- copy:    `cp` of the merged output (the same bytes): what the disk allows.

Caches are warm (every tool reads the same files just read by the one before). Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

HIDDEN = 2816  # a 2816x2816 fp32 Linear weight is 31.7 MB


def build_model(size_gb: float):
    import torch

    layers = max(1, round(size_gb * 1e9 / (HIDDEN * HIDDEN * 4)))
    torch.manual_seed(0)
    return torch.nn.Sequential(*[torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(layers)])


def produce(kind: str, out: Path, size_gb: float) -> None:
    """Runs inside each of 2 torchrun ranks."""
    import torch
    import torch.distributed as dist

    x = torch.randn(2, HIDDEN)
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_model_state_dict
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        model = build_model(size_gb)
        for layer in model:
            fully_shard(layer)
        fully_shard(model)
        dcp.save(get_model_state_dict(model), checkpoint_id=str(out))
        dist.destroy_process_group()
        return
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    model = build_model(size_gb)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    config = {"train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": int(kind[-1])},
              "zero_allow_untested_optimizer": True}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    engine.save_checkpoint(str(out), tag="step1")


def ensure_checkpoints(cache: Path, size_gb: float) -> dict[str, Path]:
    paths = {"dcp": cache / "dcp", "zero2": cache / "zero2", "zero3": cache / "zero3"}
    for kind, path in paths.items():
        if (path / "BENCH_DONE").is_file():
            continue
        shutil.rmtree(path, ignore_errors=True)
        print(f"building the {kind} checkpoint under {path} ...", file=sys.stderr)
        env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        __file__, "--produce", kind, str(path), "--size-gb", str(size_gb)], check=True, env=env,
                       stdout=subprocess.DEVNULL)
        (path / "BENCH_DONE").write_text("ok\n")
    return paths


def measure(cmd: list[str]) -> dict:
    """Run cmd in a fresh wrapper process; return its wall time and the peak RSS of the command."""
    out = subprocess.run([sys.executable, __file__, "--measure", "--", *cmd], capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _measure_child(cmd: list[str]) -> None:
    start = time.perf_counter()
    proc = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        sys.exit(proc.returncode)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    print(json.dumps({"seconds": seconds, "peak_rss": peak}))


def dir_bytes(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "accelkit-bench-merge")
    parser.add_argument("--size-gb", type=float, default=1.0)
    parser.add_argument("--produce", nargs=2, metavar=("KIND", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        _measure_child(args.rest)
        return
    if args.produce:
        produce(args.produce[0], Path(args.produce[1]), args.size_gb)
        return

    ckpts = ensure_checkpoints(args.cache, args.size_gb)
    work = args.cache / "outputs"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    py = sys.executable
    ds_script = "zero_to_fp32.py"
    runs = [
        ("DCP (FSDP2)", "accelkit merge-ckpt",
         [py, "-m", "accelkit", "merge-ckpt", str(ckpts["dcp"]), "-o", str(work / "a.safetensors"), "-q"],
         work / "a.safetensors"),
        ("DCP (FSDP2)", "accelerate merge-weights",
         [py, "-m", "accelerate.commands.accelerate_cli", "merge-weights", str(ckpts["dcp"]), str(work / "b")],
         work / "b"),
    ]
    for stage in ("zero2", "zero3"):
        label = f"DeepSpeed ZeRO-{stage[-1]}"
        runs += [
            (label, "accelkit merge-ckpt",
             [py, "-m", "accelkit", "merge-ckpt", str(ckpts[stage]), "-o", str(work / f"{stage}-a.safetensors"),
              "-q"], work / f"{stage}-a.safetensors"),
            (label, "DeepSpeed zero_to_fp32.py",
             [py, str(ckpts[stage] / ds_script), str(ckpts[stage]), str(work / f"{stage}-b"),
              "--safe_serialization"], work / f"{stage}-b"),
        ]
    runs.append(("~1 GB output", "cp (plain copy, disk limit)",
                 ["cp", str(work / "a.safetensors"), str(work / "copy.safetensors")], work / "copy.safetensors"))

    rows = []
    for label, tool, cmd, out in runs:
        print(f"running {tool} on {label} ...", file=sys.stderr)
        result = measure(cmd)
        rows.append((label, tool, result["seconds"], result["peak_rss"] / 2**20, dir_bytes(out) / 1e9))
    in_sizes = {k: dir_bytes(v) / 1e9 for k, v in ckpts.items()}
    print(f"\ncheckpoint on disk: DCP {in_sizes['dcp']:.2f} GB, ZeRO-2 {in_sizes['zero2']:.2f} GB, "
          f"ZeRO-3 {in_sizes['zero3']:.2f} GB (with Adam state); {os.cpu_count()} CPUs\n")
    print("| input | tool | wall time (s) | peak RSS (MB) | output (GB) |")
    print("|---|---|---:|---:|---:|")
    for label, tool, seconds, rss, size in rows:
        print(f"| {label} | {tool} | {seconds:.1f} | {rss:.0f} | {size:.2f} |")


if __name__ == "__main__":
    main()
