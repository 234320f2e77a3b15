"""SLURM job overhead: time from submission to end of a 2-node job written by `accelkit launch --slurm` vs a bare
`srun ... torchrun` job running the same script, on a real local Slurm cluster (tests/helpers/slurm.py: munged,
slurmctld and two slurmd nodes on this host). Also: how long the cross-node preflight takes to stop a job whose
nodes see different copies of the script, from the moment the nodes start (the batch step's "machine 0 is" line,
printed as it starts srun) to the preflight's error line in the job's log, and what the bare job does with the
same diverged nodes (it has no such check: each node runs its own copy).

The script is the same for both jobs: it imports torch, forms a gloo process group of world size 2 (one rank per
node), all-reduces one tensor and exits. The bare job is what users write by hand:

    srun --nodes=2 --ntasks-per-node=1 bash -c 'torchrun --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID \
        --master-addr 127.0.0.1 --master-port P hello.py'

The accelkit job adds a batch step (address, port, job board), one supervised launcher per node (Accelerate's
launcher under it) and the preflight. Runs alternate between the two so machine load hits both alike; medians and
minima are compared (goal: accelkit <= 1.10x bare).

    python benchmarks/slurm_overhead.py [--runs 3] [--network]

--network runs the nodes as two hosts (each its own network namespace on a bridge, tests/helpers/netns.py): the
bare job then finds machine 0's NodeAddr with scontrol and sets GLOO_SOCKET_IFNAME=eth0 by hand, as it must; the
accelkit job finds both itself (and checks the port and addresses at preflight).
"""

from __future__ import annotations

import argparse
import os
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
{network}srun --nodes=2 --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c \\
  'exec {python} -m torch.distributed.run --nnodes 2 --nproc-per-node 1 --node-rank $SLURM_NODEID \\
   --master-addr {address} --master-port {port} hello.py'
"""
# Across hosts (--network), what a user who knows the pitfalls writes by hand: machine 0's NodeAddr (node names do
# not resolve) and the interface gloo must use (the host name resolves to a loopback address).
BARE_NETWORK = """\
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_ADDR=$(scontrol show node -o "$first" | sed -n 's/.*NodeAddr=\\([^ ]*\\).*/\\1/p')
export GLOO_SOCKET_IFNAME=eth0
"""


def bare_job(python: str, port: int, network: bool) -> str:
    if network:
        return BARE.format(python=python, port=port, network=BARE_NETWORK, address="$MASTER_ADDR")
    return BARE.format(python=python, port=port, network="", address="127.0.0.1")


def timed_job(cluster: SlurmCluster, script: Path) -> float:
    """Submission to the job's end, polled every 0.2 s (sbatch --wait polls with growing intervals: seconds late)."""
    start = time.perf_counter()
    job_id, code = cluster.submit_and_wait(script, timeout=600)
    seconds = time.perf_counter() - start
    if code != 0:
        raise SystemExit(f"{script.name} (job {job_id}) failed with {code}")
    cluster.wait_idle()
    return seconds


class LogWatch:
    """When each marker first appears in a job's log (polled every 20 ms, on this machine's clock)."""

    def __init__(self, path: Path, markers: dict[str, str]) -> None:
        self.path, self.markers, self.seen = path, markers, {}

    def poll(self) -> None:
        text = self.path.read_text(errors="replace") if self.path.exists() else ""
        now = time.perf_counter()
        for name, marker in self.markers.items():
            if name not in self.seen and marker in text:
                self.seen[name] = now


def watched_job(cluster: SlurmCluster, script: Path, log_name: str, markers: dict[str, str]) -> tuple[int, dict]:
    """Submit `script` and poll its log for `markers` until the job ends: (exit code, {"submitted", markers...,
    "ended"} -> perf_counter times)."""
    submitted = time.perf_counter()
    job_id = cluster.submit(script)
    watch = LogWatch(script.parent / log_name.replace("%j", job_id), markers)
    deadline = submitted + 600
    while cluster.job_fields(job_id).get("JobState") in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
        watch.poll()
        if time.perf_counter() > deadline:
            raise SystemExit(f"{script.name} (job {job_id}) still running after 600 s")
        time.sleep(0.02)
    ended = time.perf_counter()
    watch.poll()
    code = cluster.wait_job(job_id)
    cluster.wait_idle()
    return code, {"submitted": submitted, **watch.seen, "ended": ended}


def diverged_folder(cluster: SlurmCluster, name: str) -> Path:
    """A folder whose last node sees another copy of hello.py (the cluster's node-local folder)."""
    project = cluster.node_local / name
    project.mkdir()
    (project / "hello.py").write_text(HELLO)
    (cluster.node_local_copy / name).mkdir()
    (cluster.node_local_copy / name / "hello.py").write_text(HELLO + "# edited on this node only\n")
    return project


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--network", action="store_true",
                        help="each node its own network namespace (two hosts on a bridge, tests/helpers/netns.py)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="slurm-overhead-"))
    try:
        with SlurmCluster(root / "cluster", network=args.network) as cluster:
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
                bare.write_text(bare_job(sys.executable, free_port(), args.network))
                times["bare srun + torchrun"].append(timed_job(cluster, bare))
                times["accelkit --slurm"].append(timed_job(cluster, work / "accelkit.sbatch"))

            # Preflight: a node that sees another copy of the script. accelkit's job, then the bare one.
            project = diverged_folder(cluster, "diverged")
            run_accelkit("launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                         "hello.py", cwd=project, check=True)
            preflight = []
            for _ in range(args.runs):
                refused, marks = watched_job(cluster, project / "job.sbatch", "accelkit-%j.out",
                                             {"nodes start": "machine 0 is", "error": "would not run the same job",
                                              "rank": "hello rank="})
                if refused == 0 or "error" not in marks or "rank" in marks:
                    raise SystemExit(f"the diverged job was not stopped by the preflight (exit {refused})")
                preflight.append({**marks, "exit": refused})
            bare_project = diverged_folder(cluster, "diverged-bare")
            (bare_project / "bare.sbatch").write_text(bare_job(sys.executable, free_port(), args.network))
            bare_code, bare_marks = watched_job(cluster, bare_project / "bare.sbatch", "bare-%j.out",
                                                {"rank": "hello rank="})
    finally:
        shutil.rmtree(root, ignore_errors=True)

    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    print(f"{os.cpu_count()} CPU(s), load average (1, 5, 15 min) at the end: {load}")
    where = "two hosts (network namespaces on a bridge)" if args.network else "both nodes on this host's loopback"
    print(f"2-node job, 1 CPU rank per node, local Slurm cluster, {where}; {args.runs} run(s) each (submission to "
          "end)")
    print(f"{'job':<24}{'median s':>10}{'min s':>10}")
    for name, values in times.items():
        print(f"{name:<24}{statistics.median(values):>10.2f}{min(values):>10.2f}")
    bare_median = statistics.median(times["bare srun + torchrun"])
    ratio = statistics.median(times["accelkit --slurm"]) / bare_median
    print(f"accelkit / bare: {ratio:.2f}x (median), "
          f"{min(times['accelkit --slurm']) / min(times['bare srun + torchrun']):.2f}x (min)")
    print()
    print(f"one node with another copy of the script; {args.runs} run(s) of accelkit's job")
    print(f"{'job':<24}{'nodes start -> error s':>24}{'submission -> end s':>22}{'exit':>6}")
    to_error = [marks["error"] - marks["nodes start"] for marks in preflight]
    to_end = [marks["ended"] - marks["submitted"] for marks in preflight]
    codes = "/".join(sorted({str(marks["exit"]) for marks in preflight}))
    print(f"{'accelkit --slurm':<24}{statistics.median(to_error):>24.2f}{statistics.median(to_end):>22.2f}"
          f"{codes:>6}   (medians; min {min(to_error):.2f} s to the error; no rank started)")
    print(f"{'bare srun + torchrun':<24}{'no error':>24}{bare_marks['ended'] - bare_marks['submitted']:>22.2f}"
          f"{bare_code:>6}   (each node ran its own copy{'; the ranks ran' if 'rank' in bare_marks else ''})")


if __name__ == "__main__":
    main()
