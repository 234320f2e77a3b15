"""Launch overhead: time from command start to the script's first line, `accelkit launch` vs `accelerate launch`.

All start the same job: 2 DDP ranks on CPU over gloo, the same Accelerate config (the one accelkit generates for
`--cpu --backend ddp --num-processes 2`, given to `accelerate launch --config_file` with the same environment),
and the same probe script. Measured per run, from the moment the command starts:
- first line: the probe's first line runs (it prints a timestamp and exits);
- job up: the probe has imported torch and Accelerate and `Accelerator()` has formed the process group (a second
  set of runs, where the probe exits right there): what a training script waits for before its first step.
Accelerate is timed both as its `accelerate launch` CLI and as `python -m accelerate.commands.launch` (its lean
entry point, which skips the CLI's other subcommands). Runs alternate between the tools so machine load hits all
alike; medians are compared.

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
MARK = {"first line": re.compile(r"PROBE first_line rank=\d+ t=([\d.]+)"),
        "job up": re.compile(r"PROBE accelerator rank=\d+ t=([\d.]+)")}
PROBE_ARGS = {"first line": ["--first-line-only"], "job up": ["--exit-after-accelerator"]}


def accelerate_config() -> tuple[Path, dict[str, str], Path]:
    """The config file and environment accelkit resolves for the job, for Accelerate to run as they are."""
    from accelkit.configs import ConfigOptions
    from accelkit.launch.plan import LauncherFlags, LaunchTarget
    from accelkit.launch.prepare import prepare_launch
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest(target=LaunchTarget(str(PROBE)), options=ConfigOptions(backend="ddp", num_processes=2),
                            cpu=True, flags=LauncherFlags())
    prepared = prepare_launch(request, check_hardware=False)
    return prepared.plan.config_path, prepared.plan.env, prepared.temp_dir


def commands(config: Path) -> dict[str, list[str]]:
    accelerate = shutil.which("accelerate") or "accelerate"
    return {
        "accelerate launch": [accelerate, "launch", "--config_file", str(config), str(PROBE)],
        "python -m accelerate.commands.launch": [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
                                                 str(config), str(PROBE)],
        "accelkit launch": [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp",
                            "--num-processes", "2", str(PROBE)],
    }


def time_once(argv: list[str], env: dict[str, str], metric: str) -> float:
    """Seconds from the command's start to the first rank reaching `metric`."""
    start = time.time()
    proc = subprocess.run(argv + PROBE_ARGS[metric], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    stamps = [float(t) for t in MARK[metric].findall(proc.stdout)]
    if len(stamps) != 2:
        raise SystemExit(f"expected 2 ranks to reach {metric}, got {len(stamps)}:\n{proc.stdout}")
    return min(stamps) - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    config, env, temp_dir = accelerate_config()
    tools = commands(config)
    extra_env = {name: ({} if name == "accelkit launch" else env) for name in tools}
    results = {(name, metric): [] for name in tools for metric in MARK}
    try:
        for name, argv in tools.items():  # warm-up: page cache, .pyc files
            time_once(argv, extra_env[name], "first line")
        for run in range(args.runs):
            for metric in MARK:
                for name, argv in tools.items():
                    seconds = time_once(argv, extra_env[name], metric)
                    results[(name, metric)].append(seconds)
                    print(f"run {run + 1}/{args.runs}  {metric:10s}  {name:38s} {seconds:6.2f} s", flush=True)
    finally:
        shutil.rmtree(temp_dir, ignore_errors=True)

    medians = {key: statistics.median(values) for key, values in results.items()}
    minima = {key: min(values) for key, values in results.items()}
    print(f"\n{args.runs} runs each ({os.cpu_count()} CPUs, load average now {os.getloadavg()[0]:.1f}); "
          "median (min) seconds from command start")
    print(f"{'':38s} {'first line':>16s} {'job up':>16s}")
    for name in tools:
        cells = [f"{medians[(name, m)]:6.2f} ({minima[(name, m)]:5.2f})" for m in MARK]
        print(f"{name:38s} {cells[0]:>16s} {cells[1]:>16s}")
    for base in ("accelerate launch", "python -m accelerate.commands.launch"):
        parts = []
        for metric in MARK:
            ours, theirs = medians[("accelkit launch", metric)], medians[(base, metric)]
            best = minima[("accelkit launch", metric)] - minima[(base, metric)]
            parts.append(f"{metric} {100 * (ours / theirs - 1):+.1f}% ({ours - theirs:+.2f} s; min {best:+.2f} s)")
        print(f"accelkit launch vs {base}: " + ", ".join(parts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
