"""What the sandbox of `accelkit convert --check` costs: measuring and copying a working directory, next to `cp -a`.

    python benchmarks/check_sandbox.py [--mib 512] [--files 2000] [--repeat 3]

The tree: a data folder of `--files` files holding `--mib` MiB in all (a few big shards and many small files), a
source folder of small modules, a `__pycache__` and a linked folder outside the tree (copied as what it points to).
Each run copies the tree into a fresh folder of the same temp folder (what `--check` does once per run, twice per
check); the peer is `cp -a` of the same tree, which keeps links as links (a sandbox must not). Medians of --repeat.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from accelkit.convert.check.sandbox import plan_sandbox


def make_tree(root: Path, mib: int, files: int) -> Path:
    project, outside = root / "project", root / "datasets"
    for folder in (project / "data", project / "src", project / "__pycache__", outside):
        folder.mkdir(parents=True)
    (project / "train.py").write_text("print('train')\n")
    big = 4
    small = max(files - big, 1)
    shard = (mib * 2**20 * 3 // 4) // big
    chunk = os.urandom(2**20)
    for i in range(big):
        with open(project / "data" / f"shard{i}.bin", "wb") as f:
            for _ in range(shard // len(chunk)):
                f.write(chunk)
    rest = (mib * 2**20 // 4) // small
    for i in range(small):
        (project / "data" / f"sample{i:05d}.json").write_bytes(chunk[:rest])
    for i in range(50):
        (project / "src" / f"module{i}.py").write_text(f"X = {i}\n" * 20)
    (outside / "extra.bin").write_bytes(chunk)
    (project / "linked").symlink_to(outside)
    return project


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=512)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sandbox-bench-") as tmp:
        root = Path(tmp)
        project = make_tree(root, args.mib, args.files)
        rows: dict[str, list[float]] = {"measure (plan_sandbox)": [], "measure + copy (one run's sandbox)": [],
                                        "cp -a (peer; keeps links)": []}
        plan = plan_sandbox(project, project / "train.py", limit=2**40)
        for i in range(args.repeat):
            start = time.perf_counter()
            plan = plan_sandbox(project, project / "train.py", limit=2**40)
            measured = time.perf_counter() - start
            plan.materialize(root / f"box{i}")
            rows["measure (plan_sandbox)"].append(measured)
            rows["measure + copy (one run's sandbox)"].append(time.perf_counter() - start)
            shutil.rmtree(root / f"box{i}")
            start = time.perf_counter()
            subprocess.run(["cp", "-a", str(project), str(root / f"cp{i}")], check=True)
            rows["cp -a (peer; keeps links)"].append(time.perf_counter() - start)
            shutil.rmtree(root / f"cp{i}")
        print(f"tree: {plan.files:,} files, {plan.size / 2**20:.0f} MiB copied ({args.mib} MiB of data, a linked "
              f"folder, sources); medians of {args.repeat} runs")
        floor = statistics.median(rows["cp -a (peer; keeps links)"])
        print(f"  {'':40} {'wall':>9} {'vs cp -a':>9}")
        for name, values in rows.items():
            median = statistics.median(values)
            print(f"  {name:40} {median:8.2f}s {median / floor:8.2f}x")


if __name__ == "__main__":
    main()
