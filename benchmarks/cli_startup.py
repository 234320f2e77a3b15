"""Start-up time of `accelkit --help` next to `accelerate --help`, median of several runs each.

    python benchmarks/cli_startup.py [--runs 7]

Both commands run as fresh processes through their console scripts in this environment, alternating so that
caches warm up for both alike. The goal is accelkit taking under a fifth of Accelerate's time.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path


def console_script(name: str) -> list[str]:
    beside_python = Path(sys.executable).with_name(name)
    found = str(beside_python) if beside_python.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"cannot find the `{name}` command; install the project first (pip install -e .)")
    return [found]


def time_once(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    commands = {"accelkit --help": console_script("accelkit") + ["--help"],
                "accelerate --help": console_script("accelerate") + ["--help"]}
    for argv in commands.values():  # warm the file cache once
        time_once(argv)
    timings: dict[str, list[float]] = {label: [] for label in commands}
    for _ in range(args.runs):
        for label, argv in commands.items():
            timings[label].append(time_once(argv))

    medians = {label: statistics.median(values) for label, values in timings.items()}
    print(f"{'command':<20} {'median (s)':>10} {'min (s)':>8} {'max (s)':>8}   runs={args.runs}")
    for label, values in timings.items():
        print(f"{label:<20} {medians[label]:>10.3f} {min(values):>8.3f} {max(values):>8.3f}")
    ratio = medians["accelkit --help"] / medians["accelerate --help"]
    print(f"ratio accelkit/accelerate: {ratio:.2f} (goal: under 0.20)")


if __name__ == "__main__":
    main()
