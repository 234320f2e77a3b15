"""SLURM jobs on a real Slurm cluster: munged, slurmctld and two slurmd nodes (n1, n2) on this host (see
tests/helpers/slurm.py). Every test writes its job with `accelkit launch --slurm` and submits the file as a user
would (`sbatch --wait`), then checks the job's exit status, its log and what it left behind.

Each node is its own network namespace (tests/helpers/netns.py: its own loopback and an `eth0` on a bridge, its
own address as NodeAddr) while the host name resolves to 127.0.0.1, as on Debian clusters: the ranks cross a
network, and a job that advertised the host name's address, or took machine 0's address from its name (node
names do not resolve here), would fail. No test sets an interface or an address by hand. One cluster serves the
whole module (all tests in this file run on one pytest worker: --dist loadfile). Each node has a fake
`Gres=gpu:8` (placeholder device files): GPU-shaped jobs are scheduled as on a GPU cluster, and SLURM gives their
steps CUDA_VISIBLE_DEVICES; the CPU jobs (`--cpu`) ask for no GPU.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from helpers import DATA, REPO_ROOT, run_accelkit
from helpers.slurm import (
    CPUS_PER_NODE,
    MEMORY_MIB_PER_NODE,
    NODES,
    SlurmCluster,
    module_cluster,
    write_job,
)

from accelkit.scaffold import init_project

PROBE = DATA / "launch" / "probe.py"
RECORD_RANK = DATA / "slurm" / "record_rank.py"
FAKE_CUDA = DATA / "slurm" / "fake_cuda"  # sitecustomize: torch counts the GPUs SLURM gave (CUDA_VISIBLE_DEVICES)
GPUS_PER_NODE = 8
UNFINISHED = ("", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "RESIZING",
              "SUSPENDED")  # a job's states before its end (scontrol show job's JobState)

STALL_SCRIPT = """\
import sys, time
import torch
from accelerate import Accelerator

accelerator = Accelerator()
rank = accelerator.process_index
tensor = torch.ones(1)
torch.distributed.all_reduce(tensor)
print(f"STALL ready rank={rank}", flush=True)
if rank == accelerator.num_processes - 1:
    time.sleep(3600)  # this rank stops progressing; the others wait for it in the next collective
torch.distributed.all_reduce(tensor)
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    yield from module_cluster(tmp_path_factory.mktemp("slurm-cluster"), gpus_per_node=GPUS_PER_NODE, network=True)


def submit(cluster: SlurmCluster, job: Path, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Submit and wait for the end (polled: quicker than sbatch --wait); the job's exit code, id and log."""
    job_id, code = cluster.submit_and_wait(job, env=env)
    log = (job.parent / f"accelkit-{job_id}.out").read_text(errors="replace")
    cluster.wait_idle()
    return code, job_id, log


def job_processes(cluster: SlurmCluster, job_id: str) -> list[psutil.Process]:
    """Every process on this host that belongs to the job (its environment names the job id and the cluster)."""
    found = []
    for proc in psutil.process_iter():
        try:
            env = proc.environ()
            if env.get("SLURM_JOB_ID") == job_id and env.get("SLURM_CONF") == str(cluster.conf):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_two_node_ddp_training_of_a_template_and_merge(cluster: SlurmCluster, tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    job = write_job(project, "--cpu", "--backend", "ddp", "--nodes", "2", "--gpus-per-node", "1", "train.py",
                    "--max-steps", "2", "--num-samples", "64", "--output-dir", "out")
    assert "scontrol show hostnames" not in job.read_text()
    code, _, log = submit(cluster, job)
    assert code == 0, log
    # NodeAddr (n1's own network namespace), not the node's (unresolvable) name nor the host name's 127.0.0.1
    assert f"machine 0 is n1 at {cluster.node_address('n1')}:" in log, log
    # Each node found the interface on its route to machine 0 (nothing set it by hand): gloo's ranks meet there.
    assert f"ranks talk on eth0 (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME): it holds machine 0's " \
           f"address {cluster.node_address('n1')}" in log, log
    assert f"this machine's route to machine 0 at {cluster.node_address('n1')} goes through it (from " \
           f"{cluster.node_address('n2')})" in log, log
    assert "world size 2" in log
    checkpoint = project / "out" / "checkpoint-2"
    assert (checkpoint / "accelkit-manifest.json").is_file(), log
    merged = run_accelkit("merge-ckpt", str(checkpoint), "-o", str(tmp_path / "merged"), "--verify")
    assert merged.returncode == 0, merged.stderr
    assert list((tmp_path / "merged").glob("*.safetensors"))


def test_gpu_shaped_job_gives_every_rank_its_place_and_its_nodes_gpus(cluster: SlurmCluster, tmp_path: Path) -> None:
    """`--nodes 2 --gpus-per-node 8` without --cpu: SLURM accepts the job for the nodes' 8 GPUs each, and accelkit's
    batch step and per-node launchers (with their GPU checks, on torch counting the GPUs SLURM gave) start 16 ranks,
    which record what they see instead of training. The job's folder has a space in its name (#SBATCH --chdir is
    quoted)."""
    folder = tmp_path / "gpu job"
    folder.mkdir()
    shutil.copy(RECORD_RANK, folder / "record_rank.py")
    job = write_job(folder, "--nodes", "2", "--gpus-per-node", str(GPUS_PER_NODE), "record_rank.py", "seen")
    assert f"#SBATCH --gpus-per-node={GPUS_PER_NODE}" in job.read_text()
    accepted = cluster.run("sbatch", "--test-only", str(job), cwd=folder)
    assert accepted.returncode == 0 and "to start at" in accepted.stderr, accepted.stderr
    # Asking no CPUs, the job takes whole nodes: every CPU of both nodes, not one CPU per node for 8 GPU ranks.
    assert "#SBATCH --exclusive" in job.read_text()
    assert f"using {2 * CPUS_PER_NODE} processors on nodes n[1-2]" in accepted.stderr, accepted.stderr
    # The fake Gres is real to the scheduler: a node shape no node has is refused.
    bigger = cluster.run("sbatch", "--test-only", f"--gpus-per-node={GPUS_PER_NODE + 1}", str(job), cwd=folder)
    assert bigger.returncode != 0, bigger.stderr

    (folder / "seen").mkdir()
    pythonpath = os.pathsep.join(filter(None, [str(FAKE_CUDA), str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    code, job_id, log = submit(cluster, job, env={"PYTHONPATH": pythonpath})
    assert code == 0, log
    assert "CPU rehearsal" not in log and "ACCELKIT_REHEARSAL" not in log  # the GPU path, not a rehearsal
    seen = {int(path.stem.removeprefix("rank-")): json.loads(path.read_text())
            for path in (folder / "seen").glob("rank-*.json")}
    assert sorted(seen) == list(range(2 * GPUS_PER_NODE)), log
    address = cluster.node_address("n1")
    port = re.search(rf"machine 0 is n1 at {re.escape(address)}:(\d+)", log).group(1)
    for rank, env in seen.items():
        machine, local = divmod(rank, GPUS_PER_NODE)
        assert env["SLURMD_NODENAME"] == f"n{machine + 1}" and env["SLURM_NODEID"] == str(machine), env
        assert env["GROUP_RANK"] == str(machine) and env["LOCAL_RANK"] == str(local), env
        assert env["WORLD_SIZE"] == str(2 * GPUS_PER_NODE) and env["LOCAL_WORLD_SIZE"] == str(GPUS_PER_NODE), env
        assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == (address, port), env
        assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == "eth0", env
        # Every rank sees its node's 8 GPUs (LOCAL_RANK picks its own), and no rank is told to use the CPU.
        assert env["CUDA_VISIBLE_DEVICES"] == ",".join(map(str, range(GPUS_PER_NODE))), env
        assert env["SLURM_GPUS_ON_NODE"] == str(GPUS_PER_NODE) and env["ACCELERATE_USE_CPU"] is None, env
    assert job_processes(cluster, job_id) == []


SHARDED = {"fsdp": (["--backend", "fsdp"], "FSDP", "dtensor"),
           "zero3": (["--backend", "deepspeed", "--zero-stage", "3"], "DEEPSPEED", "zero3")}


def test_fsdp_and_zero3_rehearsals_on_two_nodes_by_two_processes_at_once(cluster: SlurmCluster,
                                                                          tmp_path: Path) -> None:
    """Two jobs sharing the two nodes at the same time (each asks one CPU a node, which the nodes' CPU binding
    gives them): an FSDP and a DeepSpeed ZeRO-3 rehearsal of 2 nodes x 2 processes, each on its own port; then the
    shards their four ranks saved from two nodes merge into one model."""
    jobs = {}
    for name, (backend, _, _) in SHARDED.items():
        folder = tmp_path / name
        folder.mkdir()
        shutil.copy(PROBE, folder / "probe.py")
        jobs[name] = write_job(folder, "--cpu", *backend, "--nodes", "2", "--gpus-per-node", "2",
                               "--cpus-per-node", "1", "probe.py", "--output", "state")
    ids = {name: cluster.submit(job) for name, job in jobs.items()}
    # Across two namespaced hosts each job takes ~65-90 s alone on a loaded 2-core machine; together, more.
    codes = {name: cluster.wait_job(job_id, timeout=480) for name, job_id in ids.items()}
    logs = {name: (jobs[name].parent / f"accelkit-{job_id}.out").read_text(errors="replace")
            for name, job_id in ids.items()}
    assert codes == {"fsdp": 0, "zero3": 0}, logs
    times = {name: cluster.job_fields(job_id) for name, job_id in ids.items()}
    assert times["fsdp"]["StartTime"] <= times["zero3"]["EndTime"], times  # the jobs shared the nodes
    assert times["zero3"]["StartTime"] <= times["fsdp"]["EndTime"], times
    machine_zero = re.escape(cluster.node_address("n1"))
    ports = {name: re.search(rf"machine 0 is n1 at {machine_zero}:(\d+)", log).group(1) for name, log in logs.items()}
    assert ports["fsdp"] != ports["zero3"], ports

    merges = {name: subprocess.Popen([sys.executable, "-m", "accelkit", "merge-ckpt", str(job.parent / "state"), "-o",
                                      str(job.parent / "merged"), "--verify"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for name, job in jobs.items()}
    for name, (_, kind, shard) in SHARDED.items():
        log = logs[name]
        found = re.findall(r"PROBE rank=(\d+) world=(\d+) type=(\w+) wrapper=\w+ shard=(\w+):(\d+)/(\d+) "
                           r"backend=(\w+)", log)
        assert sorted(int(rank) for rank, *_ in found) == [0, 1, 2, 3], log
        for _, world, distributed_type, layout, held, total, process_group in found:
            assert (world, distributed_type, layout, process_group) == ("4", kind, shard, "gloo"), log
            assert int(held) * 4 == int(total), log  # each rank holds a quarter of every parameter
        nodes = dict(re.findall(r"PROBE done rank=(\d+) slurm_node=(\w+)", log))
        assert nodes == {"0": "n1", "1": "n1", "2": "n2", "3": "n2"}, log
        out, err = merges[name].communicate(timeout=300)
        assert merges[name].returncode == 0, err
        assert "world size 4" in out, out
        assert (jobs[name].parent / "merged" / "model.safetensors").is_file()
    cluster.wait_idle()


AFFINITY_SCRIPT = """\
import os
print(f"AFFINITY rank={os.environ['RANK']} cpus={len(os.sched_getaffinity(0))}", flush=True)
"""


def test_the_cpus_a_job_asks_for_are_granted_and_every_rank_sees_them(cluster: SlurmCluster, tmp_path: Path) -> None:
    """The test cluster binds every step to the CPUs it was granted (task/affinity) and declares this machine's real
    CPUs and memory per node. `sbatch --test-only` grants the job what it asks (not one CPU per node), a node shape
    no node has is refused, and each rank of a real job sees all the CPUs of its node's task: SLURM 22.05's srun
    does not pass --cpus-per-task on to the step by itself, and the ranks would otherwise share one CPU."""
    binding = cluster.run("srun", "--nodes=1", "--cpus-per-task=1", sys.executable, "-c",
                          "import os; print(len(os.sched_getaffinity(0)))")
    assert binding.returncode == 0 and binding.stdout.strip() == "1", binding.stdout + binding.stderr

    (tmp_path / "affinity.py").write_text(AFFINITY_SCRIPT)
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--cpus-per-node", str(CPUS_PER_NODE),
                    "--mem-per-node", "1GiB", "affinity.py")
    lines = job.read_text().splitlines()
    assert f"#SBATCH --cpus-per-task={CPUS_PER_NODE}" in lines and "#SBATCH --mem=1024M" in lines
    accepted = cluster.run("sbatch", "--test-only", str(job), cwd=tmp_path)
    assert accepted.returncode == 0, accepted.stderr
    assert f"using {2 * CPUS_PER_NODE} processors on nodes n[1-2]" in accepted.stderr, accepted.stderr
    for too_much in (f"--cpus-per-task={CPUS_PER_NODE + 1}", f"--mem={MEMORY_MIB_PER_NODE + 1}M"):
        refused = cluster.run("sbatch", "--test-only", too_much, str(job), cwd=tmp_path)
        assert refused.returncode != 0, (too_much, refused.stderr)

    code, job_id, log = submit(cluster, job)
    assert code == 0, log
    seen = dict(re.findall(r"AFFINITY rank=(\d+) cpus=(\d+)", log))
    assert seen == {"0": str(CPUS_PER_NODE), "1": str(CPUS_PER_NODE)}, log
    assert job_processes(cluster, job_id) == []


def test_first_failing_rank_exit_code_is_the_jobs(cluster: SlurmCluster, tmp_path: Path) -> None:
    shutil.copy(PROBE, tmp_path / "probe.py")
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "probe.py", "--crash-rank", "1",
                    "--crash-code", "7")
    proc = cluster.sbatch_wait(job)  # as a user would: sbatch --wait returns the job's exit status
    assert proc.returncode == 7, proc.stderr
    job_id = re.search(r"Submitted batch job (\d+)", proc.stdout).group(1)
    log = (tmp_path / f"accelkit-{job_id}.out").read_text()
    cluster.wait_idle()
    assert "accelkit: the job failed: rank 1 on node n2 (machine 1) exited with status 7" in log
    assert job_processes(cluster, job_id) == []


@contextlib.contextmanager
def port_held_on_node(cluster: SlurmCluster, node: str) -> Iterator[int]:
    """A port listened on inside `node`'s network (its namespace, or this host on the loopback cluster)."""
    if cluster.hosts is None:
        with socket.socket() as busy:
            busy.bind(("", 0))
            busy.listen()
            yield busy.getsockname()[1]
        return
    listen = "import socket, sys, time\ns = socket.socket(); s.bind(('', 0)); s.listen()\n" \
             "print(s.getsockname()[1], flush=True); time.sleep(3600)"
    holder = subprocess.Popen(cluster.hosts.enter(NODES.index(node), sys.executable, "-c", listen),
                              stdout=subprocess.PIPE, text=True)
    try:
        yield int(holder.stdout.readline())
    finally:
        holder.kill()
        holder.wait()


def test_a_fixed_port_in_use_on_machine_zero_stops_the_job_before_any_node_starts(cluster: SlurmCluster,
                                                                                     tmp_path: Path) -> None:
    shutil.copy(PROBE, tmp_path / "probe.py")
    with port_held_on_node(cluster, "n1") as port:  # another job's rendezvous on machine 0
        job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--main-process-port", str(port),
                        "probe.py")
        code, job_id, log = submit(cluster, job)
    assert code == 1, log
    errors = [line for line in log.splitlines() if line.startswith("Error: ")]
    assert errors == [f"Error: port {port} is already in use on machine 0 (node n1)"], log
    assert "Traceback" not in log and "PROBE" not in log and "srun" not in log, log
    assert job_processes(cluster, job_id) == []


def test_stalled_rank_is_reported_from_inside_the_job(cluster: SlurmCluster, tmp_path: Path) -> None:
    (tmp_path / "stall.py").write_text(STALL_SCRIPT)
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--stall-timeout", "6", "stall.py")
    started = time.monotonic()
    code, job_id, log = submit(cluster, job)
    assert code == 124, log
    assert time.monotonic() - started < 120
    assert "the job stalled" in log
    # Every rank's stack, from both nodes: the sleeping rank's line and the other rank's wait in the collective.
    assert "time.sleep(3600)" in log, log
    assert "torch.distributed.all_reduce(tensor)" in log, log
    assert re.search(r"accelkit: the job stalled \(exit 124\): on node n2 \(machine 1\), no rank is in a "
                     r"collective \(rank 1 at stall.py:\d+ in <module>\)", log), log
    assert job_processes(cluster, job_id) == []


def test_scancel_leaves_no_process(cluster: SlurmCluster, tmp_path: Path) -> None:
    shutil.copy(PROBE, tmp_path / "probe.py")
    job = write_job(tmp_path, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "probe.py", "--sleep", "600")
    submitted = cluster.run("sbatch", "--parsable", str(job), cwd=tmp_path)
    job_id = submitted.stdout.strip().split(";")[0]
    assert job_id.isdigit(), submitted.stderr
    log = tmp_path / f"accelkit-{job_id}.out"
    try:
        deadline = time.monotonic() + 120
        while log.read_text().count("PROBE ready") < 2 if log.exists() else True:
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.5)
        ranks = [p for p in job_processes(cluster, job_id) if p.name() == "python" and "probe.py" in p.cmdline()]
        assert len(ranks) == 2, [p.cmdline() for p in job_processes(cluster, job_id)]
    finally:
        cluster.run("scancel", job_id)
    deadline = time.monotonic() + 60
    while cluster.run("squeue", "-h", "-j", job_id).stdout.strip() or job_processes(cluster, job_id):
        assert time.monotonic() < deadline, [p.cmdline() for p in job_processes(cluster, job_id)]
        time.sleep(0.5)
    cluster.wait_idle()


def test_nodes_with_different_scripts_stop_before_any_rank(cluster: SlurmCluster) -> None:
    project = cluster.node_local / "preflight"
    project.mkdir()
    shutil.copy(PROBE, project / "probe.py")
    # The last node sees its own copy of the folder (as a machine with its own disk), with an edited script.
    copy = cluster.node_local_copy / "preflight"
    copy.mkdir()
    (copy / "probe.py").write_text(PROBE.read_text() + "\n# edited on this node only\n")
    job = write_job(project, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "probe.py")
    started = time.monotonic()
    code, _, log = submit(cluster, job)
    assert code == 1, log
    assert time.monotonic() - started < 60
    assert re.search(r"Error: the nodes would not run the same job: script sha256: n1 \(machine 0\) has "
                     r"[0-9a-f]{12}, n2 \(machine 1\) has [0-9a-f]{12}", log), log
    assert "PROBE" not in log  # no rank started


def test_preempted_job_saves_requeues_and_ends_with_an_uninterrupted_runs_weights(cluster: SlurmCluster,
                                                                                   tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    train_args = ["--max-steps", "300", "--num-samples", "1024", "--per-device-batch-size", "8", "--log-every", "50",
                  "--lr-scheduler", "constant", "--warmup-steps", "0"]
    # The same training without interruption, on one machine with the same world size, meanwhile.
    reference = subprocess.Popen(
        [sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "train.py",
         *train_args, "--output-dir", "reference"], cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True)
    job = write_job(project, "--cpu", "--backend", "ddp", "--nodes", "2", "--gpus-per-node", "1", "--requeue",
                    "train.py", *train_args, "--output-dir", "out", "--resume-from-checkpoint", "latest")
    assert "#SBATCH --requeue" in job.read_text() and "#SBATCH --signal=B:USR1@120" in job.read_text()
    job_id = cluster.run("sbatch", "--parsable", str(job), cwd=project).stdout.strip().split(";")[0]
    assert job_id.isdigit()
    log = project / f"accelkit-{job_id}.out"
    try:
        deadline = time.monotonic() + 180
        while not (log.exists() and "machine 0 is" in log.read_text(errors="replace")):
            assert time.monotonic() < deadline, log.read_text() if log.exists() else "no log"
            time.sleep(0.2)
        # What SLURM does ahead of the time limit or a preemption: SIGUSR1 to the batch step (--signal=B:USR1@S).
        # Sent as the job starts: the nodes repeat the request to their ranks until the script's handler takes it.
        cluster.run("scancel", "--signal=USR1", "--batch", job_id)
        deadline = time.monotonic() + 300
        # Until the job ends for good; a query that fails under load ("" state) is no answer, not the end, and
        # neither is a final-looking state during the requeue itself: the end is a final state that lasts 5 s.
        states: list[str] = []
        ended_at = pending_since = None
        while True:
            state = cluster.job_fields(job_id).get("JobState", "")
            if not states or states[-1] != state:
                states.append(state)
            assert time.monotonic() < deadline, states
            if state in UNFINISHED:
                ended_at = None
                pending_since = (pending_since or time.monotonic()) if state == "PENDING" else None
                # SLURM holds a requeued job for 120 s before it may start again: not here. But not within the
                # second of the requeue either: slurmd refuses a credential made in the second it revoked the
                # job's last one ("Job credential revoked"), and the job fails.
                if pending_since is not None and time.monotonic() - pending_since > 2:
                    cluster.run("scontrol", "update", f"jobid={job_id}", "starttime=now")
            elif ended_at is None:
                ended_at = time.monotonic()
            elif time.monotonic() - ended_at > 5:
                break
            time.sleep(0.5)
    finally:
        cluster.run("scancel", job_id)
    text = log.read_text(errors="replace")
    assert "stopped on SIGUSR1 after step" in text, text
    assert re.search(r"resumed from \S+checkpoint-(\d+) at step \1", text), f"job states {states}\n{text}"
    stopped = int(re.search(r"stopped on SIGUSR1 after step (\d+)", text).group(1))
    assert 0 < stopped < 300
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out
    resumed = load_file(project / "out" / "final" / "model.safetensors")
    straight = load_file(project / "reference" / "final" / "model.safetensors")
    assert resumed.keys() == straight.keys()
    assert all(torch.equal(resumed[key], straight[key]) for key in straight)
    cluster.wait_idle()
