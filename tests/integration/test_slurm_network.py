"""SLURM jobs across hosts that stop before any rank starts, with one line naming the node, the address or folder
and the fix: on a Slurm cluster whose two nodes are separate network namespaces (tests/helpers/slurm.py with
network=True: each node its own loopback and eth0, the host name resolving to 127.0.0.1).

Each refusal is checked as a fault: the job's exit status, one distinct `Error:` line (each node prints it), no
traceback, no rank started, nothing left in the job's folder but its log, and no process left in either node's
namespace but its slurmd.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers import DATA
from helpers.slurm import NODES, SlurmCluster, module_cluster, write_job

from accelkit.launch.ports import free_port

PROBE = DATA / "launch" / "probe.py"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    yield from module_cluster(tmp_path_factory.mktemp("slurm-net"), network=True)


def assert_refused_cleanly(cluster: SlurmCluster, job: Path, error: str, env: dict[str, str] | None = None,
                           folders: tuple[Path, ...] = ()) -> str:
    """Submit `job`, expect it to stop before any rank with exactly `error` (a regex), and check that it left
    nothing behind: the job's log is the only new file in its folder (and in `folders`), and each node's namespace
    holds only its slurmd again. The job's log."""
    folders = (job.parent, *folders)
    before = {folder: sorted(folder.iterdir()) for folder in folders}
    daemons = {node: cluster.node_pids(node) for node in NODES}
    started = time.monotonic()
    job_id, code = cluster.submit_and_wait(job, env=env, timeout=120)
    log_file = job.parent / f"accelkit-{job_id}.out"
    log = log_file.read_text(errors="replace")
    assert code == 1, log
    assert time.monotonic() - started < 60, log
    errors = {line for line in log.splitlines() if line.startswith("Error: ")}
    assert len(errors) == 1, log
    assert re.fullmatch(error, errors.pop()), log
    assert any(line.lstrip().startswith("Hint: ") for line in log.splitlines()), log
    assert "Traceback" not in log and "PROBE" not in log and "ranks talk on" not in log, log  # no rank started
    cluster.wait_idle()
    for folder, files in before.items():
        assert sorted(path for path in folder.iterdir() if path != log_file) == files, folder
    deadline = time.monotonic() + 30
    while {node: cluster.node_pids(node) for node in NODES} != daemons:
        assert time.monotonic() < deadline, {node: cluster.node_pids(node) for node in NODES}
        time.sleep(0.3)
    return log


def test_an_unreachable_machine_zero_port_stops_the_job_before_any_rank(cluster: SlurmCluster,
                                                                        tmp_path: Path) -> None:
    """Node n2 may not open connections to machine 0's rendezvous port (a policy rule in its namespace: what a
    firewall does), while the rest of the network works (the batch step's job board on another port)."""
    shutil.copy(PROBE, tmp_path / "probe.py")
    port = free_port("")
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--main-process-port", str(port),
                    "probe.py")
    n2 = cluster.hosts.names[1]
    rule = ["ipproto", "tcp", "dport", str(port), "prohibit"]
    subprocess.run(["ip", "-n", n2, "rule", "add", *rule], check=True)
    try:
        address = re.escape(cluster.node_address("n1"))
        log = assert_refused_cleanly(cluster, job, rf"Error: node n2 \(machine 1\) cannot reach machine 0 at "
                                                   rf"{address}:{port}: Permission denied")
    finally:
        subprocess.run(["ip", "-n", n2, "rule", "del", *rule], check=True)
    assert f"Hint: open TCP port {port} on machine 0 (n1) to the other nodes (firewall)" in log, log


def test_a_loopback_machine_zero_address_stops_the_job_before_any_rank(cluster: SlurmCluster,
                                                                       tmp_path: Path) -> None:
    """MAIN_PROCESS_IP=127.0.0.1 (what the host name resolves to here): every node would wait on its own loopback."""
    shutil.copy(PROBE, tmp_path / "probe.py")
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "probe.py")
    assert_refused_cleanly(cluster, job, r"Error: machine 0's address 127\.0\.0\.1 is a loopback address, but node n2 "
                                         r"\(machine 1\) is another machine: it would look for machine 0 on its own "
                                         r"loopback", env={"MAIN_PROCESS_IP": "127.0.0.1"})


def test_a_working_directory_not_shared_stops_a_sharded_job_before_any_rank(cluster: SlurmCluster) -> None:
    """An FSDP job in a folder that node n2 sees as its own copy (a node-local disk): its shards would be split."""
    project, copy = cluster.node_local / "unshared", cluster.node_local_copy / "unshared"
    for folder in (project, copy):
        folder.mkdir()
        shutil.copy(PROBE, folder / "probe.py")  # the same script on both nodes: only the folder differs
    job = write_job(project, "--cpu", "--backend", "fsdp", "--nodes", "2", "--gpus-per-node", "1", "probe.py",
                    "--output", "state")
    shutil.copy(job, copy / job.name)
    shutil.copy(project / "job.accelerate.yaml", copy / "job.accelerate.yaml")
    log = assert_refused_cleanly(cluster, job, rf"Error: the working directory {re.escape(str(project))} is not "
                                               r"shared: node n1 \(machine 0\) does not see the file node n2 "
                                               r"\(machine 1\) wrote there, and this job's checkpoints are sharded "
                                               r"across nodes", folders=(copy,))
    assert "Hint: run the job from a directory on a filesystem every node mounts" in log, log
