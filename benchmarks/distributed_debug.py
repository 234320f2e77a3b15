"""What TORCH_DISTRIBUTED_DEBUG=DETAIL costs on gloo, and what it buys: the basis for turning it on in rehearsals.

DETAIL wraps every process group in a checker that, before each collective, compares the collective's type and
tensor shapes across ranks (one extra small all-gather on a helper gloo group), so a rank that calls `barrier` while
another calls `all_reduce` fails at once with both names instead of hanging. This script runs the same 2-rank
gloo job with TORCH_DISTRIBUTED_DEBUG unset (OFF) and with DETAIL, alternating, and prints per-operation times:

- `all_reduce 4 KB`: a tight loop of small all-reduces (the worst case: the check doubles the messages);
- `all_reduce 4 MB`: large all-reduces (the check is a fixed cost per call);
- `DDP step`: forward + backward + AdamW step of a 2-layer MLP (4.2M parameters) wrapped in DistributedDataParallel
  (measured on torch 2.13 CPU: with DETAIL, constructing DistributedDataParallel segfaults in
  `Logger.set_construction_data_and_log`, so this row reports the crash; this is why rehearsals leave DETAIL off).

    python benchmarks/distributed_debug.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

PARTS = {"collectives": ("all_reduce 4 KB", "all_reduce 4 MB"), "ddp": ("DDP step",)}

WORKLOAD = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist

    def timed(out, name, fn, n):
        fn()  # warm-up
        dist.barrier()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - start) / n

    def ddp_step():
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1024)))
        opt = torch.optim.AdamW(model.parameters())
        x = torch.randn(16, 1024)

        def step():
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        return step

    dist.init_process_group("gloo")
    out = {}
    small, large = torch.ones(1024), torch.ones(1024 * 1024)
    if sys.argv[2] == "collectives":
        timed(out, "all_reduce 4 KB", lambda: dist.all_reduce(small), 400)
        timed(out, "all_reduce 4 MB", lambda: dist.all_reduce(large), 20)
    else:
        timed(out, "DDP step", ddp_step(), 20)
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()
""")


def run_once(script: Path, mode: str, part: str, port: int) -> dict[str, float | str]:
    """One 2-rank torchrun of `part`; a rank killed by a signal is recorded as that signal's name."""
    import signal

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("TORCH_DISTRIBUTED_DEBUG", None)
    if mode == "DETAIL":
        env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--master-port", str(port), str(script), result.name, part],
                              env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode == 0:
            return json.loads(Path(result.name).read_text())
    died = re.search(r"exitcode\s*:\s*-(\d+)", proc.stderr)
    reason = f"crash ({signal.Signals(int(died.group(1))).name})" if died else f"fails (exit {proc.returncode})"
    return dict.fromkeys(PARTS[part], reason)


def median_text(values: list[float | str]) -> str:
    failures = [v for v in values if isinstance(v, str)]
    return failures[0] if failures else f"{statistics.median(values) * 1e3:.3f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from accelkit.launch.ports import free_port

    results: dict[str, dict[str, list[float | str]]] = {"OFF": {}, "DETAIL": {}}
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "workload.py"
        script.write_text(WORKLOAD)
        for _ in range(args.runs):
            for part in PARTS:
                for mode in results:  # alternate, so machine load hits both alike
                    for name, value in run_once(script, mode, part, free_port()).items():
                        results[mode].setdefault(name, []).append(value)
    print(f"2 gloo ranks (torch {torch_version()}), median of {args.runs} runs, "
          f"load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'operation':<18}{'OFF':>14}{'DETAIL':>22}{'DETAIL/OFF':>12}")
    for name in results["OFF"]:
        off, detail = results["OFF"][name], results["DETAIL"][name]
        ratio = ("-" if any(isinstance(v, str) for v in off + detail)
                 else f"{statistics.median(detail) / statistics.median(off):.2f}x")
        print(f"{name:<18}{median_text(off):>14}{median_text(detail):>22}{ratio:>12}")


def torch_version() -> str:
    from importlib.metadata import version

    return version("torch")


if __name__ == "__main__":
    main()
