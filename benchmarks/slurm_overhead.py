"""SLURM job overhead: time from submission to end of a 2-node job written by `accelkit launch --slurm` vs a bare
`srun ... torchrun` job running the same script, on a real local Slurm cluster (tests/helpers/slurm.py: munged,
slurmctld and two slurmd nodes on this host). Also: how long the cross-node preflight takes to stop a job whose
nodes see different copies of the script (from submission to the job's end).

The script is the same for both jobs: it imports torch, forms a gloo process group of world size 2 (one rank per
node), all-reduces one tensor and exits. The bare job is what users write by hand:

    srun --nodes=2 --ntasks-per-node=1 bash -c 'torchrun --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID \
        --master-addr 127.0.0.1 --master-port P hello.py'

The accelkit job adds a batch step (address, port, job board), one supervised launcher per node (Accelerate's
launcher under it) and the preflight. Runs alternate between the two so machine load hits both alike; medians and
minima are compared (goal: accelkit <= 1.10x bare).

    python benchmarks/slurm_overhead.py [--runs 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from helpers.slurm import SlurmCluster  # noqa: E402

HELLO = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
tensor = torch.ones(1)
dist.all_reduce(tensor)
print(f"hello rank={dist.get_rank()} world={dist.get_world_size()} sum={tensor.item():g}", flush=True)
dist.destroy_process_group()
"""

BARE = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --output=bare-%j.out
set -euo pipefail
srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \\
  'exec {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID \\
   --master-addr 127.0.0.1 --master-port {port} hello.py'
"""


def timed_job(cluster: SlurmCluster, script: Path) -> float:
    """Submission to the job's end, polled every 0.2 s (sbatch --wait polls with growing intervals: seconds late)."""
    start = time.perf_counter()
    job_id, code = cluster.submit_and_wait(script, timeout=600)
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{script.name} (job {job_id}) failed with {code}")
    cluster.wait_idle()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slurm-overhead-"))
    try:
        with SlurmCluster(root / "cluster") as cluster:
            work = root / "work"
            work.mkdir()
            (work / "hello.py").write_text(HELLO)
            from helpers import run_accelkit

            written = run_accelkit("launch", "--cpu", "--slurm", "accelkit.sbatch", "--nodes", "2", "--gpus-per-node",
                                   "1", "hello.py", cwd=work)
            if written.returncode != 0:
                raise SystemExit(written.stderr)
            from accelkit.launch.ports import free_port

            times: dict[str, list[float]] = {"bare srun + torchrun": [], "accelkit --slurm": []}
            for _ in range(args.runs):
                bare = work / "bare.sbatch"
                bare.write_text(BARE.format(python=sys.executable, port=free_port()))
                times["bare srun + torchrun"].append(timed_job(cluster, bare))
                times["accelkit --slurm"].append(timed_job(cluster, work / "accelkit.sbatch"))

            # Preflight: a node that sees another copy of the script (the cluster's node-local folder).
            project = cluster.node_local / "diverged"
            project.mkdir()
            (project / "hello.py").write_text(HELLO)
            (cluster.node_local_copy / "diverged").mkdir()
            (cluster.node_local_copy / "diverged" / "hello.py").write_text(HELLO + "# edited\n")
            run_accelkit("launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                         "hello.py", cwd=project, check=True)
            start = time.perf_counter()
            _, refused = cluster.submit_and_wait(project / "job.sbatch", timeout=600)
            preflight = time.perf_counter() - start
            cluster.wait_idle()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    print(f"2-node job, 1 CPU rank per node, local Slurm cluster; {args.runs} run(s) each (submission to end)")
    print(f"{'job':<24}{'median s':>10}{'min s':>10}")
    for name, values in times.items():
        print(f"{name:<24}{statistics.median(values):>10.2f}{min(values):>10.2f}")
    bare_median = statistics.median(times["bare srun + torchrun"])
    ratio = statistics.median(times["accelkit --slurm"]) / bare_median
    print(f"accelkit / bare: {ratio:.2f}x (median), "
          f"{min(times['accelkit --slurm']) / min(times['bare srun + torchrun']):.2f}x (min)")
    print(f"mismatched script: the job ended with exit {refused} after {preflight:.2f} s "
          "(submission to end, preflight included)")


if __name__ == "__main__":
    main()
