"""Launch overhead: the wall time of one 2-process Accelerate hello-world on CPU, started by a bare `torchrun`, by
`accelkit launch` and by `accelerate launch`, and accelkit's ratio to bare torchrun.

The job is the same for every tool: 2 ranks on CPU over gloo running tests/data/launch/probe.py, which prints its
first line, imports torch and Accelerate, builds `Accelerator()` (the process group forms) and exits. What is timed:
- wall: from the command's start to its exit (what a user waits for; the figure the ratio is taken on);
- first line: until the script's first line runs on the first rank;
- job up: until `Accelerator()` has returned on the first rank.
The tools:
- `torchrun --nproc_per_node 2 --master_port P probe.py` with ACCELERATE_USE_CPU=true (the bare floor: torch's own
  launcher, no config, no checks);
- `accelkit launch --cpu --num-processes 2 probe.py` (everything included: the light CLI process, the launcher
  process that resolves and writes the config, Accelerate's launcher, the rehearsal bootstrap in each rank);
- `accelerate launch --config_file C probe.py` with the config and environment accelkit resolves for that job
  (`accelerate launch --cpu --num_processes 2` alone would start one process).
Runs alternate between the tools so that machine load hits all alike; medians (and minima) are compared.

    python benchmarks/launch_overhead.py [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "data" / "launch" / "probe.py"
STAMPS = {"first line": re.compile(r"PROBE first_line rank=\d+ t=([\d.]+)"),
          "job up": re.compile(r"PROBE accelerator rank=\d+ t=([\d.]+)")}
METRICS = ("wall", "first line", "job up")
TORCHRUN, ACCELKIT, ACCELERATE = "torchrun (bare)", "accelkit launch", "accelerate launch"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def accelerate_config() -> tuple[Path, dict[str, str], Path]:
    """The config file and rank environment accelkit resolves for the job, for Accelerate to run as they are."""
    from accelkit.configs import ConfigOptions
    from accelkit.launch.build_plan import prepare_launch
    from accelkit.launch.launch_plan import LaunchTarget
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest(target=LaunchTarget(str(PROBE)), options=ConfigOptions(num_processes=2), cpu=True)
    prepared = prepare_launch(request, check_hardware=False)
    env = {k: v for k, v in prepared.plan.env.items() if k != "ACCELKIT_REHEARSAL"}  # no accelkit bootstrap
    return prepared.plan.config_path, env, prepared.temp_dir


def command(tool: str, config: Path, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment of one run of `tool` (a fresh port each time)."""
    probe = [str(PROBE), "--exit-after-accelerator"]
    bin_dir = Path(sys.executable).parent
    if tool == TORCHRUN:
        torchrun = shutil.which("torchrun", path=str(bin_dir)) or "torchrun"
        return [torchrun, "--nproc_per_node", "2", "--master_port", str(free_port()), *probe], \
            {"ACCELERATE_USE_CPU": "true"}
    if tool == ACCELKIT:
        return [sys.executable, "-m", "accelkit", "launch", "--cpu", "--num-processes", "2", *probe], {}
    accelerate = shutil.which("accelerate", path=str(bin_dir)) or "accelerate"
    return [accelerate, "launch", "--config_file", str(config), "--main_process_port", str(free_port()), *probe], env


def time_once(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Seconds from the command's start to its exit and to the first rank's first line / Accelerator()."""
    start = time.time()
    proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    out = {"wall": end - start}
    for metric, pattern in STAMPS.items():
        stamps = [float(t) for t in pattern.findall(proc.stdout)]
        if len(stamps) != 2:
            raise SystemExit(f"expected 2 ranks to reach {metric}, got {len(stamps)}:\n{proc.stdout}")
        out[metric] = min(stamps) - start
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    config, env, temp_dir = accelerate_config()
    tools = (TORCHRUN, ACCELKIT, ACCELERATE)
    results: dict[tuple[str, str], list[float]] = {(t, m): [] for t in tools for m in METRICS}
    try:
        for tool in tools:  # warm-up: page cache, .pyc files
            time_once(*command(tool, config, env))
        for run in range(args.runs):
            for tool in tools:
                seconds = time_once(*command(tool, config, env))
                for metric in METRICS:
                    results[(tool, metric)].append(seconds[metric])
                print(f"run {run + 1}/{args.runs}  {tool:18s} " +
                      "  ".join(f"{m} {seconds[m]:5.2f} s" for m in METRICS), flush=True)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)

    median = {key: statistics.median(values) for key, values in results.items()}
    least = {key: min(values) for key, values in results.items()}
    print(f"\n2-process Accelerate hello-world on CPU, {args.runs} runs each ({os.cpu_count()} CPUs, load average "
          f"now {os.getloadavg()[0]:.1f}); median (min) seconds from the command's start")
    print(f"{'':20s}" + "".join(f"{m:>17s}" for m in METRICS) + f"{'wall / torchrun':>17s}")
    for tool in tools:
        cells = "".join(f"{median[(tool, m)]:8.2f} ({least[(tool, m)]:5.2f})" for m in METRICS)
        ratio = median[(tool, "wall")] / median[(TORCHRUN, "wall")]
        print(f"{tool:20s}{cells}{ratio:16.2f}x")
    ratio = median[(ACCELKIT, "wall")] / median[(TORCHRUN, "wall")]
    print(f"\naccelkit launch / bare torchrun, wall time: {ratio:.2f}x (goal <= 1.10x); "
          f"vs accelerate launch: {median[(ACCELKIT, 'wall')] / median[(ACCELERATE, 'wall')]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
