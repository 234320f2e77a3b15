"""Writing a SkyPilot task or a Kubernetes TrainJob with bad inputs: unknown accelerators, node counts that do not add
up, several targets at once, outputs that exist or cannot be written, files the nodes would not get. Each is
refused with one line (and a hint), and nothing is written. The refusals run in process (`invoke_fault`); the
read-only folders, which need a mount namespace, in real processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

PROBE = DATA / "launch" / "probe.py"
SKY = ["--skypilot", "task.yaml"]
KUBE = ["--kubernetes", "trainjob.yaml", "--image", "img"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(PROBE.read_text())
    return tmp_path


def refused(project: Path, args: list[str], match: str, exit_code: int = 1):
    result = invoke_fault(["launch", *args, "train.py"], watch=[project], cwd=project)
    return result.assert_refused(match, exit_code=exit_code, hint=exit_code == 1)


@pytest.mark.parametrize("name", ["H1000", "H100:8"])
def test_unknown_accelerator(project: Path, name: str) -> None:
    refused(project, [*SKY, "--nodes", "2", "--gpus-per-node", "8", "--accelerator", name],
            f"unknown accelerator '{name}' for --accelerator")


@pytest.mark.parametrize(("args", "match"), [
    ([*SKY, "--nodes", "2", "--gpus-per-node", "8"], "--skypilot needs the accelerator"),
    ([*SKY, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--accelerator", "H100"], "--cpu runs on CPU"),
    ([*SKY, "--accelerator", "H100", "--nodes", "2", "--num-machines", "3", "--gpus-per-node", "8"],
     "--nodes 2 and --num-machines 3 disagree"),
    ([*SKY, "--accelerator", "H100", "--nodes", "3", "--num-processes", "4"], "does not split over 3 nodes"),
    ([*KUBE, "--nodes", "2"], "--kubernetes needs the number of GPUs per node"),
    ([*KUBE, "--nodes", "2", "--gpus-per-node", "4", "--num-processes", "6"],
     "--num-processes 6 is not --num-machines x"),
    ([*SKY, "--cpu", "--nodes", "0", "--gpus-per-node", "1"], "--num-machines must be at least 1"),
    ([*KUBE, "--num-machines", "-1", "--gpus-per-node", "1"], "--num-machines must be at least 1"),
    ([*KUBE, "--nodes", "2", "--gpus-per-node", "1", "--machine-rank", "1"], "come from Kubernetes in the TrainJob"),
    ([*KUBE, "--nodes", "2", "--gpus-per-node", "1", "--main-process-port", "29400"], "PET_MASTER_PORT"),
    ([*KUBE, "--nodes", "2", "--gpus-per-node", "1", "--job-name", "My_Job"], "is not a Kubernetes name"),
    (["--kubernetes", "trainjob.yaml", "--nodes", "2", "--gpus-per-node", "1"], "--kubernetes needs the container"),
    ([*SKY, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--config", "/etc/hostname"],
     "the config /etc/hostname is outside"),
])
def test_bad_jobs_are_refused(project: Path, args: list[str], match: str) -> None:
    refused(project, args, match)


@pytest.mark.parametrize(("args", "match"), [
    ([*SKY, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1"],
     "--slurm and --skypilot cannot be combined"),
    ([*SKY, *KUBE, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1"],
     "--slurm and --skypilot and --kubernetes cannot be combined"),
    ([*SKY, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--requeue"], "--requeue only applies with --slurm"),
    (["--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1", "--accelerator", "H100"],
     "--accelerator only applies with --skypilot"),
    (["--cpu", "--image", "img"], "--image only applies with --kubernetes"),
    (["--cpu", "--force"], "--force only applies with"),
])
def test_usage_errors(project: Path, args: list[str], match: str) -> None:
    refused(project, args, match, exit_code=2)


@pytest.mark.parametrize("target", [SKY, KUBE, ["--slurm", "job.sbatch"]])
def test_existing_output_without_force(project: Path, target: list[str]) -> None:
    (project / target[1]).write_text("mine\n")
    refused(project, [*target, "--cpu", "--nodes", "2", "--gpus-per-node", "1"], f"{target[1]} already exists")


def test_existing_config_beside_the_job_without_force(project: Path) -> None:
    (project / "task.accelerate.yaml").write_text("mine\n")
    refused(project, [*SKY, "--cpu", "--nodes", "2", "--gpus-per-node", "1"], "task.accelerate.yaml already exists")


def test_force_replaces_the_job(project: Path) -> None:
    target = SKY
    (project / target[1]).write_text("mine\n")
    result = invoke_fault(["launch", *target, "--cpu", "--nodes", "2", "--gpus-per-node", "1", "--force",
                           "train.py"], watch=[project], cwd=project, expect="ok")
    assert result.returncode == 0, result.stderr
    assert "ACCELKIT_LAUNCH_REQUEST" in (project / target[1]).read_text()
    assert sorted(Path(p).name for p in result.created) == [f"{Path(target[1]).stem}.accelerate.yaml"]


@pytest.mark.parametrize("target", [SKY, KUBE])
def test_unwritable_output_folder(project: Path, target: list[str]) -> None:
    ro = project / "readonly"
    ro.mkdir()
    args = ["launch", target[0], str(ro / target[1]), *target[2:], "--cpu", "--nodes", "2", "--gpus-per-node", "1",
            "train.py"]
    result = run_fault(args, watch=[project], cwd=project, readonly=ro)
    line = result.assert_refused("read-only")
    assert str(ro) in line


def test_missing_output_folder(project: Path) -> None:
    refused(project, ["--kubernetes", "nowhere/trainjob.yaml", "--image", "img", "--cpu", "--nodes", "2",
                      "--gpus-per-node", "1"], "cannot write nowhere/trainjob.yaml: the folder nowhere does not exist")


def test_a_script_outside_the_uploaded_folder(project: Path) -> None:
    result = invoke_fault(["launch", *SKY, "--cpu", "--nodes", "2", "--gpus-per-node", "1", str(PROBE)],
                          watch=[project], cwd=project)
    result.assert_refused(f"the script {PROBE} is outside {project}")


def test_a_node_without_the_job_board_key_says_how_to_launch(project: Path) -> None:
    """The key is in neither job file: a node started without it (`sky launch` without --secret, or a pod given an
    empty key) stops with one line that says how the job is launched, before any rank starts."""
    written = invoke_fault(["launch", "--cpu", "--kubernetes", "tj.yaml", "--nodes", "2", "--gpus-per-node", "1",
                            "--image", "img", "train.py"], watch=[], cwd=project, record=False)
    assert written.returncode == 0, written.stderr
    trainer = yaml.safe_load((project / "tj.yaml").read_text())["spec"]["trainer"]
    request = next(item["value"] for item in trainer["env"] if item["name"] == "ACCELKIT_LAUNCH_REQUEST")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
    before = sorted(project.iterdir())
    proc = subprocess.run([sys.executable, "-m", "accelkit.launch.cluster.node", "--machine-rank", "0",
                           "--main-process-ip", "127.0.0.1", "--main-process-port", "1", "--job-board-port", "2"],
                          env={**env, "ACCELKIT_LAUNCH_REQUEST": request}, capture_output=True, text=True,
                          timeout=120, cwd=project)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert proc.returncode == 1 and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert errors[0] == "Error: --job-board-port needs $ACCELKIT_JOB_KEY (the job board's key)", proc.stderr
    assert "--secret ACCELKIT_JOB_KEY" in proc.stderr and "kubectl create secret generic" in proc.stderr
    assert sorted(project.iterdir()) == before
