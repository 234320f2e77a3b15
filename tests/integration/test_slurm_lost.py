"""Lost machines and restarts on a real Slurm cluster whose two nodes are network namespaces (tests/helpers/slurm.py
with network=True: each node its own loopback and eth0, as separate machines). None sets an interface or address.

- a node crash (every process of n2's namespace SIGKILLed mid-run, slurmd included) ends the job within the lost
  timeout, names the machine, and under --requeue the job is requeued, waits for the node, and resumes to an
  uninterrupted run's final weights;
- a partition (n2's eth0 down) is named;
- `--max-restarts 1` across both machines survives a rank killed on machine 1, to the same weights.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import DATA
from helpers.slurm import NODES, SlurmCluster, _binary, module_cluster, write_job

from accelkit.scaffold import init_project

LOST_TIMEOUT = 10
KILL_AT_STEP = DATA / "restarts" / "kill_at_step.py"
TRAIN_ARGS = ["--num-samples", "2048", "--per-device-batch-size", "8", "--log-every", "20", "--lr-scheduler",
              "constant", "--warmup-steps", "0", "--checkpoint-every", "40"]
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    yield from module_cluster(tmp_path_factory.mktemp("slurm-lost"), network=True)


def reference_run(project: Path, steps: int) -> subprocess.Popen:
    """The same training without interruption, on one machine with the same world size (2), started now."""
    return subprocess.Popen([sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp",
                             "--num-processes", "2", "train.py", "--max-steps", str(steps), *TRAIN_ARGS,
                             "--output-dir", "reference"], cwd=project, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def assert_same_final_weights(project: Path, reference: subprocess.Popen) -> None:
    import torch
    from safetensors.torch import load_file

    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out
    resumed = load_file(project / "out" / "final" / "model.safetensors")
    straight = load_file(project / "reference" / "final" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)


def wait_for_log(log: Path, pattern: str, timeout: float) -> re.Match:
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, log.read_text(errors="replace")) if log.exists() else None
        if found:
            return found
        assert time.monotonic() < deadline, log.read_text(errors="replace") if log.exists() else "no log"
        time.sleep(0.2)


def restart_slurmd(cluster: SlurmCluster, node: str) -> None:
    """The node is back: its slurmd again, in its namespace, as SlurmCluster.start runs it."""
    assert cluster.hosts is not None
    slurmd = [_binary("slurmd"), "-D", "-N", node, "-f", str(cluster.conf)]
    if node == NODES[-1]:
        slurmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                  'mount --bind "$0" "$1" && shift && exec "$@"', str(cluster.node_local_copy),
                  str(cluster.node_local), *slurmd]
    cluster._start(f"slurmd-{node}", cluster.hosts.enter(NODES.index(node), *slurmd))


def wait_for_end(cluster: SlurmCluster, job_id: str, timeout: float) -> str:
    """Until the job ends for good (a final state that lasts 5 s: a requeue passes through final-looking states);
    a requeued job held for SLURM's 120 s is let go after 2 s."""
    deadline = time.monotonic() + timeout
    ended_at = pending_since = None
    while True:
        state = cluster.job_fields(job_id).get("JobState", "")
        assert time.monotonic() < deadline, state
        if state not in FINISHED:
            ended_at = None
            pending_since = (pending_since or time.monotonic()) if state == "PENDING" else None
            if pending_since is not None and time.monotonic() - pending_since > 2:
                cluster.run("scontrol", "update", f"jobid={job_id}", "starttime=now")
                pending_since = time.monotonic()
        elif ended_at is None:
            ended_at = time.monotonic()
        elif time.monotonic() - ended_at > 5:
            return state
        time.sleep(0.5)


def test_a_node_crash_is_named_and_the_requeued_job_resumes_to_the_same_weights(cluster: SlurmCluster,
                                                                                 tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    steps = 400
    reference = reference_run(project, steps)
    job = write_job(project, "--cpu", "--backend", "ddp", "--nodes", "2", "--gpus-per-node", "1", "--requeue",
                    "--lost-timeout", str(LOST_TIMEOUT), "train.py", "--max-steps", str(steps), *TRAIN_ARGS,
                    "--output-dir", "out", "--resume-from-checkpoint", "latest")
    job_id = cluster.submit(job)
    log = project / f"accelkit-{job_id}.out"
    try:
        wait_for_log(log, r"step 60 \| loss", 240)
        crashed_at = time.monotonic()
        cluster.hosts.kill_all(1)  # node n2 crashes: every process in its namespace, slurmd too
        found = wait_for_log(log, r"accelkit: machine 1 \(node n2, address ([\d.]+)\) was lost: no heartbeat for "
                                  r"(\d+) s \(its processes are gone or it is unreachable\); its ranks were last at "
                                  r"step (\d+)", LOST_TIMEOUT + 60)
        named_after = time.monotonic() - crashed_at
        assert found.group(1) == cluster.node_address("n2")
        assert named_after < LOST_TIMEOUT + 20, named_after
        wait_for_log(log, r"accelkit: machine 1 \(node n2\) was lost; requeueing job \d+", 60)
        restart_slurmd(cluster, "n2")
        state = wait_for_end(cluster, job_id, 400)
    finally:
        cluster.run("scancel", job_id)
    text = log.read_text(errors="replace")
    assert state == "COMPLETED", text
    assert "failed first" not in text, text
    assert re.search(r"resumed from \S+checkpoint-(\d+) at step \1", text), text
    # No --max-restarts: the requeued run is attempt 1 of requeue 1, on both machines, whatever its environment held.
    assert re.search(r"requeue 1 of the SLURM job, attempt 1: the ranks resumed from \S+checkpoint-\d+", text), text
    assert "attempt 2" not in text and "restarting" not in text, text
    assert_same_final_weights(project, reference)
    cluster.wait_idle(120)


def test_a_partitioned_node_is_named(cluster: SlurmCluster, tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    job = write_job(project, "--cpu", "--backend", "ddp", "--nodes", "2", "--gpus-per-node", "1", "--lost-timeout",
                    str(LOST_TIMEOUT), "train.py", "--max-steps", "100000", *TRAIN_ARGS, "--output-dir", "out")
    job_id = cluster.submit(job)
    log = project / f"accelkit-{job_id}.out"
    host = cluster.hosts
    try:
        wait_for_log(log, r"step 40 \| loss", 240)
        cut_at = time.monotonic()
        subprocess.run(["ip", "-n", host.names[1], "link", "set", "eth0", "down"], check=True)
        wait_for_log(log, r"accelkit: the job failed: machine 1 \(node n2, address " +
                     re.escape(cluster.node_address("n2")) + r"\) was lost: no heartbeat for \d+ s", LOST_TIMEOUT + 60)
        assert time.monotonic() - cut_at < LOST_TIMEOUT + 20
    finally:
        subprocess.run(["ip", "-n", host.names[1], "link", "set", "eth0", "up"], check=False)
        cluster.run("scancel", job_id)
    text = log.read_text(errors="replace")
    assert "failed first" not in text, text
    cluster.wait_idle(120)


def test_max_restarts_across_machines_survives_a_rank_killed_on_machine_one(cluster: SlurmCluster,
                                                                            tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    shutil.copy(KILL_AT_STEP, project / "kill_at_step.py")
    steps = 120
    reference = reference_run(project, steps)
    job = write_job(project, "--cpu", "--backend", "ddp", "--nodes", "2", "--gpus-per-node", "1", "--max-restarts",
                    "1", "kill_at_step.py", "train.py", "--max-steps", str(steps), *TRAIN_ARGS, "--output-dir", "out",
                    "--resume-from-checkpoint", "latest")
    job_id, code = cluster.submit_and_wait(job, env={"KILL_RANK": "1", "KILL_STEP": "50"}, timeout=300)
    text = (project / f"accelkit-{job_id}.out").read_text(errors="replace")
    assert code == 0, text
    assert re.search(r"accelkit: rank 1 \(pid \d+\) was killed by SIGKILL on node n2 \(machine 1\); restarting "
                     r"every rank: attempt 2 of 2 \(--max-restarts 1\)", text), text
    assert re.search(r"attempt 2: the ranks resumed from \S*checkpoint-40 \(step 40\)", text), text
    assert_same_final_weights(project, reference)
    cluster.wait_idle(120)
