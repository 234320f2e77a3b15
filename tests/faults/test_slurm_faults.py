"""Writing a SLURM job with bad inputs: shapes that do not add up, outputs that cannot be written, and the job's own
entry points run outside a job. Each is refused with one line, and nothing is written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

PROBE = DATA / "launch" / "probe.py"


@pytest.mark.parametrize(("args", "match"), [
    (["--nodes", "2", "--num-machines", "3", "--gpus-per-node", "8"], "--nodes 2 and --num-machines 3 disagree"),
    (["--nodes", "2"], "--slurm needs the number of GPUs per node"),
    (["--nodes", "3", "--num-processes", "4"], "--num-processes 4 does not split over 3 nodes"),
    (["--nodes", "2", "--gpus-per-node", "4", "--num-processes", "6"], r"--num-processes 6 is not --num-machines x"),
    (["--nodes", "2", "--gpus-per-node", "1", "--machine-rank", "1"], "come from SLURM in the sbatch script"),
])
def test_bad_job_shapes_are_refused(args: list[str], match: str, tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--backend", "ddp", "--slurm", "job.sbatch", *args, str(PROBE)],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


def test_zero_nodes_is_refused(tmp_path: Path) -> None:
    # `--nodes` is `--num-machines`: refused as --num-machines 0 is
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "0", "--gpus-per-node", "1",
                           str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("--num-machines must be at least 1")


def test_unwritable_job_folder(tmp_path: Path) -> None:
    ro = tmp_path / "readonly"
    ro.mkdir()
    result = run_fault(["launch", "--cpu", "--slurm", str(ro / "job.sbatch"), "--nodes", "2", "--gpus-per-node",
                        "1", str(PROBE)], watch=[tmp_path], cwd=tmp_path, readonly=ro)
    line = result.assert_refused("read-only")
    assert str(ro) in line


def test_a_folder_where_the_job_file_goes(tmp_path: Path) -> None:
    (tmp_path / "job.sbatch").mkdir()
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("job.sbatch. is a directory", exit_code=2, hint=False)


@pytest.mark.parametrize("module", ["accelkit.launch.cluster.slurm_job", "accelkit.launch.cluster.node"])
def test_job_entry_points_outside_a_job(module: str, tmp_path: Path) -> None:
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "ACCELKIT_"))}
    extra = ["--machine-rank", "0", "--main-process-ip", "127.0.0.1", "--main-process-port", "1"] \
        if module.endswith("node") else []
    proc = subprocess.run([sys.executable, "-m", module, *extra], env=env, capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "sbatch" in proc.stderr
    assert list(tmp_path.iterdir()) == []


def test_requeue_without_a_script_that_saves_on_the_signal(tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           "--requeue", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("--requeue needs a script that saves a checkpoint on SIGUSR1")


def test_requeue_of_a_template_that_would_not_resume(tmp_path: Path) -> None:
    from accelkit.scaffold import init_project

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           "--requeue", "train.py"], watch=[tmp_path], cwd=project)
    result.assert_refused("the script must resume by itself")
    assert "--resume-from-checkpoint latest" in result.stderr


def test_signal_before_without_requeue(tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           "--signal-before", "60", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("--signal-before only applies with --requeue", exit_code=2, hint=False)


@pytest.mark.parametrize(("args", "match"), [
    (["--time", "4h"], "--time 4h is not a SLURM time limit"),
    (["--time", "1:2:3:4"], "--time 1:2:3:4 is not a SLURM time limit"),
    (["--partition", "gpu a100"], "--partition 'gpu a100' cannot go into an #SBATCH line"),
    (["--job-name", "ft\nrm -rf ~"], r"--job-name 'ft\\nrm -rf ~' cannot go into an #SBATCH line"),
    (["--job-name", "runs/ft"], "--job-name runs/ft has a '/'"),
])
def test_options_sbatch_would_refuse_or_misread(args: list[str], match: str, tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           *args, str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


@pytest.mark.parametrize(("args", "match"), [
    (["--time", "00:02:00"], r"--requeue's warning 120 s before the time limit \(--signal-before\) is not shorter "
                             r"than --time 00:02:00 \(120 s\)"),
    (["--time", "1-00:00:00", "--signal-before", "70000"], "--signal-before 70000 is more than SLURM allows"),
])
def test_requeue_warning_that_cannot_come_before_the_time_limit(args: list[str], match: str, tmp_path: Path) -> None:
    from accelkit.scaffold import init_project

    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           "--requeue", *args, "train.py", "--resume-from-checkpoint", "latest"], watch=[tmp_path],
                          cwd=project)
    result.assert_refused(match)


def test_a_folder_where_the_jobs_config_goes(tmp_path: Path) -> None:
    (tmp_path / "job.accelerate.yaml").mkdir()
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
                           str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("cannot write job.accelerate.yaml: it is a folder")
    assert not (tmp_path / "job.sbatch").exists()
