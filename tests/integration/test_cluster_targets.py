"""SkyPilot tasks and Kubeflow Trainer TrainJobs, as their schedulers would run them.

SkyPilot's own parser (`sky.Task.from_yaml`, in SkyPilot's virtualenv: tests/helpers/skypilot.py) reads the tasks
accelkit writes, and rejects broken ones. Then the task's `run` block and the TrainJob's command run as two
concurrent "nodes" (bash, with the variables SkyPilot or the Trainer would set, each in its own network namespace:
tests/helpers/netns.py, its own loopback and an eth0 on a bridge, the host name resolving to 127.0.0.1) and train a
template with world size 2 on CPU across that network; a rank failing on node 1 ends the job with its exit status,
named by machine 0. Nothing sets an interface: each node finds its own.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import DATA, REPO_ROOT
from helpers.netns import NetworkNamespaces
from helpers.skypilot import parse_tasks

from accelkit.launch.ports import free_port, port_free
from accelkit.scaffold import init_project

pytestmark = pytest.mark.slow
PROBE = DATA / "launch" / "probe.py"


@pytest.fixture(scope="module")
def hosts():
    with NetworkNamespaces(2) as namespaces:
        yield namespaces


def two_free_ports() -> int:
    """A port P with P+1 free as well (the rendezvous and machine 0's job board)."""
    while True:
        port = free_port("")
        if port < 65535 and port_free(port + 1):
            return port


def write(project: Path, *args: str) -> Path:
    """`accelkit launch ARGS` in `project` (in this process: the job file is all it makes)."""
    from click.testing import CliRunner

    from accelkit.cli import cli

    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = CliRunner().invoke(cli, ["launch", *args], catch_exceptions=False)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    return project / args[args.index("--skypilot") + 1 if "--skypilot" in args else args.index("--kubernetes") + 1]


def run_nodes(project: Path, command: str, node_env: list[dict[str, str]], hosts: NetworkNamespaces,
              timeout: float = 240) -> list[tuple]:
    """Run `command` with bash once per node, concurrently, in `project`, node i in host i's network namespace;
    each node's exit status and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "PET_", "ACCELKIT_"))}
    procs = [subprocess.Popen(hosts.enter(index, "bash", "-c", command), cwd=project, env={**env, **extra},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for index, extra in enumerate(node_env)]
    out = []
    for proc in procs:
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise
        out.append((proc.returncode, text))
    return out


def sky_nodes(task: dict, hosts: NetworkNamespaces) -> list[dict[str, str]]:
    """What SkyPilot sets on each node: its rank, every node's IP address (machine 0's first), the task's envs and
    its secrets (`sky launch --secret ACCELKIT_JOB_KEY` gives the key)."""
    ips = "".join(f"{address}\n" for address in hosts.addresses)
    return [{**task["envs"], "ACCELKIT_JOB_KEY": "0123456789abcdef", "SKYPILOT_NODE_RANK": str(rank),
             "SKYPILOT_NODE_IPS": ips, "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0"} for rank in (0, 1)]


def pod_env(trainer: dict) -> dict[str, str]:
    """The trainer container's env as the kubelet sets it: each value, or the key from the Secret it names (made
    with `kubectl create secret generic accelkit-job-key --from-literal=key=...`, as launch says)."""
    secrets = {"accelkit-job-key": {"key": "0123456789abcdef"}}
    return {item["name"]: item["value"] if "value" in item else
            secrets[item["valueFrom"]["secretKeyRef"]["name"]][item["valueFrom"]["secretKeyRef"]["key"]]
            for item in trainer["env"]}


def test_skypilots_parser_accepts_the_tasks_and_rejects_broken_ones(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROBE.read_text())
    gpu = write(tmp_path, "--backend", "fsdp", "--skypilot", "gpu.yaml", "--nodes", "2", "--gpus-per-node", "8",
                "--accelerator", "a100-80gb", "--cpus-per-node", "96", "--mem-per-node", "1TiB", "--storage",
                "/checkpoints=s3://my-bucket", "--setup", "source ~/venv/bin/activate", "train.py", "--output-dir",
                "/checkpoints/run1")
    cpu = write(tmp_path, "--cpu", "--skypilot", "cpu.yaml", "--nodes", "3", "--gpus-per-node", "2", "train.py")
    task = yaml.safe_load(gpu.read_text())
    broken = {"zero_nodes.yaml": {**task, "num_nodes": 0},
              "misspelled.yaml": {**task, "resources": {"acelerators": "A100-80GB:8"}},
              "unknown_key.yaml": {**task, "nodes": 2}}
    for name, data in broken.items():
        (tmp_path / name).write_text(yaml.safe_dump(data))
    # as `sky launch --secret ACCELKIT_JOB_KEY` parses them (the key's entry in the task has no value)
    parsed = parse_tasks([gpu, cpu, *(tmp_path / name for name in broken)], secrets={"ACCELKIT_JOB_KEY": "k" * 32})
    # SkyPilot's secret (redacted from its logs and dashboard), not one of the task's envs; nothing left unresolved
    assert parsed[0]["secrets"] == {"ACCELKIT_JOB_KEY": "k" * 32} and not parsed[0]["unresolved_secrets"], parsed[0]
    assert "ACCELKIT_JOB_KEY" not in parsed[0]["envs"] and task["secrets"] == {"ACCELKIT_JOB_KEY": None}
    assert parsed[0]["num_nodes"] == 2 and parsed[0]["accelerators"] == [{"A100-80GB": 8}], parsed[0]
    assert parsed[0]["workdir"] == str(tmp_path) and "pip install" in parsed[0]["setup"]
    # accelkit runs from a checkout here: its source tree goes to every node, and setup installs it from there
    assert parsed[0]["file_mounts"] == {"~/.accelkit/src": str(REPO_ROOT)}, parsed[0]
    assert parsed[0]["setup"].rstrip().endswith("pip install ~/.accelkit/src")
    # what a node has, asked for; the bucket every node mounts for the sharded checkpoints; the set-up on every node
    assert (parsed[0]["cpus"], parsed[0]["memory"]) == (["96+"], ["1024+"]), parsed[0]
    assert parsed[0]["storage_mounts"] == {"/checkpoints": {"source": "s3://my-bucket", "mode": "MOUNT"}}, parsed[0]
    assert parsed[0]["setup"].startswith("source ~/venv/bin/activate\npip install"), parsed[0]
    assert "\nsource ~/venv/bin/activate\n" in parsed[0]["run"], parsed[0]
    assert "SKYPILOT_NODE_RANK" in parsed[0]["run"] and "ACCELKIT_LAUNCH_REQUEST" in parsed[0]["envs"]
    assert parsed[1]["num_nodes"] == 3 and parsed[1]["accelerators"] == [None] and parsed[1]["cpus"] == ["2+"]
    errors = {name: result.get("error", "") for name, result in zip(broken, parsed[2:], strict=True)}
    assert "num_nodes should be a positive int" in errors["zero_nodes.yaml"], errors
    assert "did you mean 'accelerators'" in errors["misspelled.yaml"], errors
    assert "nodes" in errors["unknown_key.yaml"], errors


def test_skypilot_run_block_trains_a_template_on_two_hosts(tmp_path: Path, hosts: NetworkNamespaces) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    task = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--skypilot", "task.yaml", "--nodes", "2",
                                "--gpus-per-node", "1", "--main-process-port", str(two_free_ports()), "train.py",
                                "--max-steps", "2", "--num-samples", "64", "--output-dir", "out").read_text())
    (status0, log0), (status1, log1) = run_nodes(project, task["run"], sky_nodes(task, hosts), hosts)
    assert (status0, status1) == (0, 0), log0 + log1
    assert "world size 2" in log0 and "machine_rank=1" in log1
    assert f"ranks talk on eth0 (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, TP_SOCKET_IFNAME): this machine's route to " \
           f"machine 0 at {hosts.addresses[0]} goes through it (from {hosts.addresses[1]})" in log1, log1
    assert (project / "out" / "checkpoint-2" / "accelkit-manifest.json").is_file(), log0


def test_trainjob_command_trains_a_template_on_two_pods(tmp_path: Path, hosts: NetworkNamespaces) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    job = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--kubernetes", "trainjob.yaml", "--nodes", "2",
                               "--gpus-per-node", "1", "--image", "img", "train.py", "--max-steps", "2",
                               "--num-samples", "64", "--output-dir", "out").read_text())
    trainer = job["spec"]["trainer"]
    env = pod_env(trainer)
    port = str(two_free_ports())
    pods = [{**env, "PET_NNODES": "2", "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
             "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": hosts.addresses[0], "PET_MASTER_PORT": port}
            for rank in (0, 1)]
    (status0, log0), (status1, log1) = run_nodes(project, trainer["command"][2], pods, hosts)
    assert (status0, status1) == (0, 0), log0 + log1
    assert "world size 2" in log0 and "machine_rank=1" in log1
    assert (project / "out" / "checkpoint-2" / "accelkit-manifest.json").is_file(), log0


def test_a_rank_failing_on_node_1_is_the_jobs_exit_status(tmp_path: Path, hosts: NetworkNamespaces) -> None:
    (tmp_path / "probe.py").write_text(PROBE.read_text())
    task = yaml.safe_load(write(tmp_path, "--cpu", "--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "1",
                                "--main-process-port", str(two_free_ports()), "probe.py", "--crash-rank", "1",
                                "--crash-code", "7").read_text())
    (status0, log0), (status1, log1) = run_nodes(project := tmp_path, task["run"], sky_nodes(task, hosts), hosts)
    assert status1 == 7, log1
    assert status0 == 7, log0  # machine 0 reports the job's first failure, from the job board it hosts
    assert "the job failed: rank 1 on node" in log0 and "(machine 1) exited with status 7" in log0
    assert not list(project.glob("accelkit-launch-*"))


def test_pods_with_different_scripts_stop_before_any_rank(tmp_path: Path, hosts: NetworkNamespaces) -> None:
    """The cross-node preflight through the board machine 0 hosts: pod 1's image has another copy of the script."""
    pod0, pod1 = tmp_path / "pod0", tmp_path / "pod1"
    for pod in (pod0, pod1):
        pod.mkdir()
        (pod / "probe.py").write_text(PROBE.read_text())
    (pod1 / "probe.py").write_text(PROBE.read_text() + "\n# an older copy\n")
    job = yaml.safe_load(write(pod0, "--cpu", "--kubernetes", "trainjob.yaml", "--nodes", "2", "--gpus-per-node", "1",
                               "--image", "img", "probe.py").read_text())
    trainer = job["spec"]["trainer"]
    env = pod_env(trainer)
    port = str(two_free_ports())
    procs = []
    for rank, cwd in ((0, pod0), (1, pod1)):
        pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
               "PET_MASTER_ADDR": hosts.addresses[0], "PET_MASTER_PORT": port}
        procs.append(subprocess.Popen(hosts.enter(rank, "bash", "-c", trainer["command"][2]), cwd=cwd, text=True,
                                      env={**os.environ, **env, **pet}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 1, text
        errors = [line for line in text.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and "Traceback" not in text, text
        assert errors[0].startswith("Error: the nodes would not run the same job: script sha256:"), text
        assert "world size" not in text  # no rank started


PREEMPT_ARGS = ["--max-steps", "120", "--num-samples", "4096", "--per-device-batch-size", "8", "--checkpoint-every",
                "1000", "--log-every", "10", "--lr-scheduler", "constant", "--warmup-steps", "0", "--output-dir",
                "out", "--resume-from-checkpoint", "latest"]


def node_runs(project: Path, target: str, hosts: NetworkNamespaces) -> tuple[str, list[dict[str, str]]]:
    """The command every node runs and each node's variables, for a SkyPilot task or a TrainJob of PREEMPT_ARGS."""
    port = two_free_ports()
    if target == "skypilot":
        task = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--skypilot", "task.yaml", "--force",
                                    "--nodes", "2", "--gpus-per-node", "1", "--main-process-port", str(port),
                                    "train.py", *PREEMPT_ARGS).read_text())
        return task["run"], sky_nodes(task, hosts)
    job = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--kubernetes", "trainjob.yaml", "--force",
                               "--nodes", "2", "--gpus-per-node", "1", "--image", "img", "train.py",
                               *PREEMPT_ARGS).read_text())
    trainer = job["spec"]["trainer"]
    env = pod_env(trainer)
    return trainer["command"][2], [{**env, "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
                                    "PET_MASTER_ADDR": hosts.addresses[0], "PET_MASTER_PORT": str(port)}
                                   for rank in (0, 1)]


@pytest.mark.parametrize("target", ["skypilot", "trainjob"])
def test_sigterm_to_the_nodes_saves_and_the_job_resumes_to_the_same_weights(tmp_path: Path, hosts: NetworkNamespaces,
                                                                           target: str) -> None:
    """What Kubernetes or a spot instance does: SIGTERM to every node's first process mid-run. The ranks agree on a
    step, save there, and each node exits 143; the same job started again resumes to an uninterrupted run's weights
    (a plain 2-rank launch on one machine: the same ranks, the same data)."""
    import signal
    import sys
    import time

    import torch
    from safetensors.torch import load_file

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    reference = subprocess.Popen([sys.executable, "-m", "accelkit", "launch", "--cpu", "--backend", "ddp",
                                  "--num-processes", "2", "train.py", *PREEMPT_ARGS[:-4], "--output-dir", "reference"],
                                 cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    command, nodes = node_runs(project, target, hosts)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "PET_", "ACCELKIT_"))}
    procs = [subprocess.Popen(hosts.enter(index, "bash", "-c", command), cwd=project, env={**env, **extra},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for index, extra in enumerate(nodes)]
    seen, deadline = [], time.monotonic() + 240
    for line in procs[0].stdout:
        seen.append(line)
        if "step 20 |" in line:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            break
        assert time.monotonic() < deadline, "".join(seen)
    logs = ["".join(seen) + procs[0].communicate(timeout=240)[0], procs[1].communicate(timeout=240)[0]]
    assert [proc.returncode for proc in procs] == [143, 143], logs
    assert "asked 1 rank(s) to save a checkpoint and stop" in logs[0], logs[0]
    steps = sorted(int(p.name.split("-")[1]) for p in (project / "out").glob("checkpoint-*")
                   if (p / "accelkit-manifest.json").is_file())
    assert len(steps) == 1 and 20 <= steps[0] < 120, logs  # one checkpoint: the one the preemption asked for

    again = [subprocess.Popen(hosts.enter(index, "bash", "-c", command), cwd=project, env={**env, **extra},
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for index, extra in enumerate(nodes)]
    logs = [proc.communicate(timeout=300)[0] for proc in again]
    assert [proc.returncode for proc in again] == [0, 0], logs
    assert f"checkpoint-{steps[0]} at step {steps[0]}" in logs[0], logs[0]
    out, _ = reference.communicate(timeout=300)
    assert reference.returncode == 0, out
    got = load_file(project / "out" / "final" / "model.safetensors")
    expected = load_file(project / "reference" / "final" / "model.safetensors")
    assert all(torch.allclose(got[key], expected[key], atol=1e-5, rtol=0) for key in expected)
