"""SkyPilot tasks and Kubeflow Trainer TrainJobs, as their schedulers would run them.

SkyPilot's own parser (`sky.Task.from_yaml`, in SkyPilot's virtualenv: tests/helpers/skypilot.py) reads the tasks
accelkit writes, and rejects broken ones. Then the task's `run` block and the TrainJob's command run as two
concurrent local "nodes" (bash, with the variables SkyPilot or the Trainer would set, on loopback) and train a
template with world size 2 on CPU; a rank failing on node 1 ends the job with its exit status, named by machine 0.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import DATA, REPO_ROOT
from helpers.skypilot import parse_tasks

from accelkit.launch.ports import free_port, port_free
from accelkit.scaffold import init_project

pytestmark = pytest.mark.slow
PROBE = DATA / "launch" / "probe.py"


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


def run_nodes(project: Path, command: str, node_env: list[dict[str, str]], timeout: float = 240) -> list[tuple]:
    """Run `command` with bash once per node, concurrently, in `project`; each node's exit status and output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_", "PET_", "ACCELKIT_"))}
    procs = [subprocess.Popen(["bash", "-c", command], cwd=project, env={**env, **extra}, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for extra in node_env]
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


def sky_nodes(task: dict) -> list[dict[str, str]]:
    return [{**task["envs"], "SKYPILOT_NODE_RANK": str(rank), "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n",
             "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NUM_GPUS_PER_NODE": "0"} for rank in (0, 1)]


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
    parsed = parse_tasks([gpu, cpu, *(tmp_path / name for name in broken)])
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


def test_skypilot_run_block_trains_a_template_on_two_local_nodes(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    task = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--skypilot", "task.yaml", "--nodes", "2",
                                "--gpus-per-node", "1", "--main-process-port", str(two_free_ports()), "train.py",
                                "--max-steps", "2", "--num-samples", "64", "--output-dir", "out").read_text())
    (status0, log0), (status1, log1) = run_nodes(project, task["run"], sky_nodes(task))
    assert (status0, status1) == (0, 0), log0 + log1
    assert "world size 2" in log0 and "machine_rank=1" in log1
    assert (project / "out" / "checkpoint-2" / "accelkit-manifest.json").is_file(), log0


def test_trainjob_command_trains_a_template_on_two_local_pods(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    job = yaml.safe_load(write(project, "--cpu", "--backend", "ddp", "--kubernetes", "trainjob.yaml", "--nodes", "2",
                               "--gpus-per-node", "1", "--image", "img", "train.py", "--max-steps", "2",
                               "--num-samples", "64", "--output-dir", "out").read_text())
    trainer = job["spec"]["trainer"]
    env = {item["name"]: item["value"] for item in trainer["env"]}
    port = str(two_free_ports())
    pods = [{**env, "PET_NNODES": "2", "PET_NPROC_PER_NODE": str(trainer["numProcPerNode"]),
             "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port} for rank in (0, 1)]
    (status0, log0), (status1, log1) = run_nodes(project, trainer["command"][2], pods)
    assert (status0, status1) == (0, 0), log0 + log1
    assert "world size 2" in log0 and "machine_rank=1" in log1
    assert (project / "out" / "checkpoint-2" / "accelkit-manifest.json").is_file(), log0


def test_a_rank_failing_on_node_1_is_the_jobs_exit_status(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE.read_text())
    task = yaml.safe_load(write(tmp_path, "--cpu", "--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "1",
                                "--main-process-port", str(two_free_ports()), "probe.py", "--crash-rank", "1",
                                "--crash-code", "7").read_text())
    (status0, log0), (status1, log1) = run_nodes(project := tmp_path, task["run"], sky_nodes(task))
    assert status1 == 7, log1
    assert status0 == 7, log0  # machine 0 reports the job's first failure, from the job board it hosts
    assert "the job failed: rank 1 on node" in log0 and "(machine 1) exited with status 7" in log0
    assert not list(project.glob("accelkit-launch-*"))


def test_pods_with_different_scripts_stop_before_any_rank(tmp_path: Path) -> None:
    """The cross-node preflight through the board machine 0 hosts: pod 1's image has another copy of the script."""
    pod0, pod1 = tmp_path / "pod0", tmp_path / "pod1"
    for pod in (pod0, pod1):
        pod.mkdir()
        (pod / "probe.py").write_text(PROBE.read_text())
    (pod1 / "probe.py").write_text(PROBE.read_text() + "\n# an older copy\n")
    job = yaml.safe_load(write(pod0, "--cpu", "--kubernetes", "trainjob.yaml", "--nodes", "2", "--gpus-per-node", "1",
                               "--image", "img", "probe.py").read_text())
    trainer = job["spec"]["trainer"]
    env = {item["name"]: item["value"] for item in trainer["env"]}
    port = str(two_free_ports())
    procs = []
    for rank, cwd in ((0, pod0), (1, pod1)):
        pet = {"PET_NNODES": "2", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": str(rank),
               "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": port}
        procs.append(subprocess.Popen(["bash", "-c", trainer["command"][2]], cwd=cwd, text=True,
                                      env={**os.environ, **env, **pet}, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT))
    outputs = [proc.communicate(timeout=120)[0] for proc in procs]
    for proc, text in zip(procs, outputs, strict=True):
        assert proc.returncode == 1, text
        errors = [line for line in text.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1 and "Traceback" not in text, text
        assert errors[0].startswith("Error: the nodes would not run the same job: script sha256:"), text
        assert "world size" not in text  # no rank started
