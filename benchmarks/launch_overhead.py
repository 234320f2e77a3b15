"""Launch overhead: time from command start to the script's first line, `accelkit launch` vs `accelerate launch`.

Both start the same job: 2 DDP ranks on CPU over gloo, the same Accelerate config (the one accelkit generates for
`--cpu --backend ddp --num-processes 2`, given to `accelerate launch --config_file` with the same environment),
and the same probe script, which prints a timestamp on its first line and exits. Runs alternate between the two
tools so machine load hits both alike; the medians are compared.

    python benchmarks/launch_overhead.py [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROBE = REPO / "tests" / "data" / "launch" / "probe.py"
FIRST_LINE = re.compile(r"PROBE first_line rank=(\d+) t=([\d.]+)")


def accelerate_command() -> tuple[list[str], dict[str, str], Path]:
    """`accelerate launch` with the config and environment accelkit resolves for the same job."""
    from accelkit.configs import ConfigOptions
    from accelkit.launch.plan import LauncherFlags, LaunchTarget
    from accelkit.launch.prepare import prepare_launch
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest(target=LaunchTarget(str(PROBE), ("--first-line-only",)),
                            options=ConfigOptions(backend="ddp", num_processes=2), cpu=True, flags=LauncherFlags())
    prepared = prepare_launch(request, check_hardware=False)
    plan = prepared.plan
    accelerate = shutil.which("accelerate") or "accelerate"
    argv = [accelerate, "launch", "--config_file", str(plan.config_path), str(PROBE), "--first-line-only"]
    return argv, plan.env, prepared.temp_dir


def time_once(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds to the first rank's first line, seconds to exit)."""
    start = time.time()
    proc = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=600)
    end = time.time()
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    stamps = [float(t) for _, t in FIRST_LINE.findall(proc.stdout)]
    if len(stamps) != 2:
        raise SystemExit(f"expected 2 first lines, got {len(stamps)}:\n{proc.stdout}")
    return min(stamps) - start, end - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    accelerate_argv, env, temp_dir = accelerate_command()
    accelkit_argv = [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp", "--num-processes", "2",
                     str(PROBE), "--first-line-only"]
    tools = {"accelerate launch": (accelerate_argv, env), "accelkit launch": (accelkit_argv, {})}
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in tools}
    try:
        for argv, extra in tools.values():  # warm-up: page cache, .pyc files
            time_once(argv, extra)
        for run in range(args.runs):
            for name, (argv, extra) in tools.items():
                first, total = time_once(argv, extra)
                results[name].append((first, total))
                print(f"run {run + 1}/{args.runs}  {name:18s} first line {first:6.2f} s   exit {total:6.2f} s",
                      flush=True)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)

    print()
    print(f"{'tool':18s} {'first line (median)':>20s} {'exit (median)':>14s}")
    medians = {}
    for name, values in results.items():
        first = statistics.median(v[0] for v in values)
        total = statistics.median(v[1] for v in values)
        medians[name] = (first, total)
        print(f"{name:18s} {first:18.2f} s {total:12.2f} s")
    base_first, base_total = medians["accelerate launch"]
    kit_first, kit_total = medians["accelkit launch"]
    print(f"\naccelkit adds {100 * (kit_first / base_first - 1):+.1f}% to the time to the script's first line "
          f"({kit_first - base_first:+.2f} s) and {100 * (kit_total / base_total - 1):+.1f}% to the time to exit "
          f"({args.runs} runs each, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
