"""Cluster jobs asked for what no node has or no scheduler grants, with resource, environment and storage options
that cannot go into the job file, or with sharded checkpoints that would be scattered over the nodes' own disks.
Each is refused with one `Error:` line and a `Hint:`, and nothing is written (neither the job file nor its config),
even with `--force` over a job written before."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault

from accelkit.scaffold import init_project

PROBE = DATA / "launch" / "probe.py"
SLURM = ["--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "8"]
SKY = ["--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "8", "--accelerator", "H100"]
KUBE = ["--kubernetes", "trainjob.yaml", "--nodes", "2", "--gpus-per-node", "8", "--image", "img"]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(PROBE.read_text())
    return tmp_path


def refused(project: Path, args: list[str], match: str, script: tuple[str, ...] = ("train.py",),
            exit_code: int = 1) -> str:
    result = invoke_fault(["launch", *args, *script], watch=[project], cwd=project)
    return result.assert_refused(match, exit_code=exit_code, hint=exit_code == 1)


@pytest.mark.parametrize(("args", "match"), [
    # sizes no scheduler would grant, on every target
    ([*SLURM[:2], "--nodes", "5000000", "--gpus-per-node", "8"], "--num-machines 5,000,000 is more nodes than any"),
    ([*SKY[:2], "--nodes", "2", "--gpus-per-node", "4096", "--accelerator", "H100"],
     "4,096 GPUs per node is more than any one machine holds"),
    ([*KUBE[:2], "--image", "img", "--nodes", "2", "--num-processes", "8192"], "4,096 GPUs per node"),
    (["--cpu", *SLURM[:2], "--nodes", "2", "--gpus-per-node", "100000"], "100,000 processes per node"),
    ([*SLURM, "--cpus-per-node", "1000000"], "--cpus-per-node 1,000,000 is more CPUs than any one machine"),
    ([*KUBE, "--mem-per-node", "1000TB"], "--mem-per-node 1000TB is more than any one machine has"),
    ([*SKY, "--mem-per-node", "100TiB"], "--mem-per-node 100TiB is more than any one machine has"),
    ([*SLURM, "--mem-per-node", "512KB"], "less than 1 MiB"),
    ([*SLURM, "--mem-per-node", "64G"], "--mem-per-node '64G' is not a size"),
    ([*KUBE, "--shm-size", "70TiB"], "--shm-size 70TiB is more than any one machine has"),
    # too little for the node's GPU ranks
    ([*SLURM, "--cpus-per-node", "4"], "--cpus-per-node 4 is fewer than the node's 8 GPU ranks"),
    ([*KUBE, "--mem-per-node", "32GiB", "--shm-size", "64GiB"], "--shm-size is more than --mem-per-node"),
    # /dev/shm above the pod's default memory request (8 GPU ranks x 32 GiB)
    ([*KUBE, "--shm-size", "300GiB"], "--shm-size 300.00 GiB is more than the pod's memory request, 256.00 GiB "
                                      r"\(32.00 GiB x 8 processes, the default without --mem-per-node\)"),
    # what cannot go into an #SBATCH line or the job's shell
    ([*SLURM, "--account", "my account"], "--account 'my account' cannot go into an #SBATCH line"),
    ([*SLURM, "--qos", 'hi"gh'], "--qos 'hi\"gh' cannot go into an #SBATCH line"),
    ([*SLURM, "--container-image", "nvcr.io/nvidia/pytorch 24.05"], "--container-image .* cannot go into"),
    ([*SLURM, "--sbatch-arg", "constraint=a100"], "--sbatch-arg 'constraint=a100' is not a long sbatch option"),
    ([*SLURM, "--sbatch-arg", "-C a100"], "is not a long sbatch option"),
    ([*SLURM, "--sbatch-arg", "--comment=a\nb"], "cannot go into an #SBATCH line"),
    ([*SLURM, "--sbatch-arg", "--nodes=4"], "--sbatch-arg --nodes=4 sets what accelkit writes itself"),
    ([*SLURM, "--sbatch-arg", "--mem=10G"], "sets what accelkit writes itself"),
    ([*SLURM, "--sbatch-arg", "--output=x.log"], "sets what accelkit writes itself"),
    ([*SLURM, "--setup", ""], "--setup '' is not one line of shell"),
    ([*SKY, "--setup", "module load cuda\nrm -rf /"], "is not one line of shell"),
    # storage every node shares, misnamed
    ([*SKY, "--storage", "/checkpoints"], "--storage '/checkpoints' is not MOUNT=SOURCE"),
    ([*SKY, "--storage", "checkpoints=s3://b"], "mount point 'checkpoints' is not an absolute folder"),
    ([*KUBE, "--storage", "/=claim"], "mount point '/' is not an absolute folder"),
    ([*SKY, "--storage", "/checkpoints=/home/me/ckpt"], "is not a bucket SkyPilot can mount"),
    ([*KUBE, "--storage", "/checkpoints=My_Claim"], "is not a PersistentVolumeClaim name"),
    ([*KUBE, "--storage", "/ckpt=a", "--storage", "/ckpt/x=b"], "--storage mount points /ckpt and /ckpt/x overlap"),
])
def test_bad_resources_and_storage_are_refused(project: Path, args: list[str], match: str) -> None:
    refused(project, args, match)


@pytest.mark.parametrize(("args", "match"), [
    ([*SLURM, "--storage", "/c=s3://b"], "--storage only applies with --skypilot FILE/--kubernetes FILE"),
    ([*SKY, "--exclusive"], "--exclusive only applies with --slurm FILE"),
    ([*KUBE, "--account", "a"], "--account only applies with --slurm FILE"),
    ([*SKY, "--shm-size", "1GiB"], "--shm-size only applies with --kubernetes FILE"),
    (["--cpu", "--num-processes", "2", "--cpus-per-node", "2"], "--cpus-per-node only applies with"),
    ([*SLURM, "--cpus-per-node", "0"], "Invalid value for '--cpus-per-node'"),
])
def test_options_for_another_target_are_usage_errors(project: Path, args: list[str], match: str) -> None:
    refused(project, args, match, exit_code=2)


@pytest.mark.parametrize("target", ["sky", "kube"])
@pytest.mark.parametrize("backend", [["--backend", "fsdp"], ["--backend", "deepspeed", "--zero-stage", "3"],
                                     ["--backend", "deepspeed", "--zero-stage", "1"]])
def test_a_sharded_checkpoint_scattered_over_node_disks_is_refused(project: Path, target: str,
                                                                  backend: list[str]) -> None:
    """A 2-node FSDP or ZeRO job on SkyPilot or Kubernetes without shared storage: every rank would write its shard
    to its own node's disk (ZeRO-1 too: its optimizer states are per rank). Refused with the fix (--storage and
    --output-dir), and neither the job file nor its config (written when the job is planned) is left."""
    args = [*(SKY if target == "sky" else KUBE), *backend]
    error = refused(project, args, "writes sharded checkpoints from every node: on the nodes' own disks one "
                                   "checkpoint would be split over 2 machines")
    assert ("fsdp" if "fsdp" in backend else "deepspeed") in error


def test_a_scattered_checkpoint_over_an_earlier_job_leaves_it_as_it_was(project: Path) -> None:
    """--force over a DDP job written before: the refusal puts its config back (the job file was never touched)."""
    written = invoke_fault(["launch", *SKY, "--backend", "ddp", "train.py"], watch=[], cwd=project, record=False)
    assert written.returncode == 0, written.stderr
    refused(project, [*SKY, "--backend", "fsdp", "--force"], "would be split over 2 machines")


def test_a_templates_output_folder_outside_the_shared_storage_is_refused(tmp_path: Path) -> None:
    """With shared storage mounted, a template's checkpoints still go to its `outputs` folder (node-local) unless
    --output-dir points into the mount; an --output-dir elsewhere is refused the same way."""
    project = init_project(tmp_path / "proj", "minimal", backend="fsdp").directory
    storage = ["--storage", "/checkpoints=s3://my-bucket"]
    refused(project, [*SKY, "--backend", "fsdp", *storage], "writes its checkpoints to outputs, on each node's own "
                                                            "disk, not under the shared storage")
    refused(project, [*KUBE, "--backend", "fsdp", "--storage", "/checkpoints=ckpt"],
            "writes its checkpoints to /scratch/run1", script=("train.py", "--output-dir", "/scratch/run1"))
