"""How reproducible `accelkit bench`'s scaling figures are: the same sweep (`--cpu --num-processes 1,2` on the
minimal template of `accelkit init`) repeated, measured two ways, side by side:

- the old way (what issue 22 reported: 2.33x, 116% efficiency): a fixed 20-step window (`--min-time 0 --steps 20`)
  and efficiency from mean throughputs (all samples / the slowest rank's measured time), while the table showed
  medians;
- the new way: a window of at least `--min-time` seconds (default 2) and every figure from the median step time,
  with the spread (IQR) and the noise flag.

A method is only as good as its figure is stable: for each way the script prints every repetition's efficiency and
their range. Both ways run in alternation, so the machine's load hits them alike.

    python benchmarks/bench_noise.py [--repeats 3] [--min-time 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def efficiency_both_ways(data: dict) -> tuple[float, float, list[str], list[float]]:
    one, two = data["runs"]
    mean_rate = [run["samples"] / run["measured_time_s"] for run in (one, two)]
    return (mean_rate[1] / mean_rate[0] / 2, two["efficiency"], two["noise"],
            [run["step_time_s"]["iqr_share"] for run in (one, two)])


def sweep(work: Path, name: str, script: Path, min_time: float) -> dict:
    out = work / name
    window = ["--min-time", "0", "--steps", "20"] if min_time == 0 else ["--min-time", str(min_time)]
    command = ["accelkit", "bench", "--cpu", "--num-processes", "1,2", *window, "-o", str(out), str(script),
               "--max-steps", "100000"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=work)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return json.loads((out / "bench.json").read_text())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=2.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-noise-") as tmp:
        work = Path(tmp)
        subprocess.run(["accelkit", "init", str(work / "project"), "-t", "minimal"], check=True, capture_output=True)
        script = work / "project" / "train.py"
        old, new = [], []
        for repeat in range(args.repeats):
            short = sweep(work, f"short-{repeat}", script, 0)
            mean_eff, _, _, spreads_short = efficiency_both_ways(short)
            old.append(mean_eff)
            long = sweep(work, f"long-{repeat}", script, args.min_time)
            _, median_eff, noise, spreads = efficiency_both_ways(long)
            new.append(median_eff)
            steps = [run["steps"] for run in long["runs"]]
            print(f"repeat {repeat + 1}: old way (20 steps, mean throughputs) efficiency {mean_eff:.0%} "
                  f"(IQR {spreads_short[0]:.0%} / {spreads_short[1]:.0%}); new way ({args.min_time:g} s window: "
                  f"{steps[0]} / {steps[1]} steps, medians) efficiency {median_eff:.0%} (IQR {spreads[0]:.0%} / "
                  f"{spreads[1]:.0%}), noise flag: {', '.join(noise) or 'none'}", flush=True)
        print(f"old way: efficiency {min(old):.0%} .. {max(old):.0%} over {args.repeats} repeats "
              f"(range {max(old) - min(old):.0%} points)")
        print(f"new way: efficiency {min(new):.0%} .. {max(new):.0%} over {args.repeats} repeats "
              f"(range {max(new) - min(new):.0%} points)")
        print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
