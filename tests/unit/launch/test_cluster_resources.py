"""What a node has, asked for, in each target's job file: SLURM's CPUs per task (the one launcher task per node holds
all of its ranks' CPUs), memory or whole nodes, account, QOS, more #SBATCH lines, set-up lines and a pyxis
container; the TrainJob's CPU and memory requests, /dev/shm and ReadWriteMany claims (read back with the Kubeflow
Trainer's API models); SkyPilot's cpus/memory and bucket mounts (SkyPilot's own parser: tests/integration/
test_cluster_targets.py). The refusals are in tests/faults/test_cluster_resource_faults.py; the SLURM job on the
test cluster, with its CPU binding on, in tests/integration/test_slurm.py."""

from __future__ import annotations

import shlex
import subprocess

import yaml
from click.testing import CliRunner
from helpers import DATA

from accelkit.cli import cli
from accelkit.launch.cluster.slurm_job import srun_argv, step_options
from accelkit.scaffold import init_project

PROBE = DATA / "launch" / "probe.py"


def _write(folder, monkeypatch, *args: str, script: tuple[str, ...] = ("train.py",)) -> str:
    monkeypatch.chdir(folder)
    if not (folder / "train.py").exists():
        (folder / "train.py").write_text(PROBE.read_text())
    result = CliRunner().invoke(cli, ["launch", *args, *script], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.output


def _sbatch_lines(path) -> list[str]:
    return [line for line in path.read_text().splitlines() if line.startswith("#SBATCH")]


def test_a_gpu_job_asking_nothing_takes_whole_nodes(tmp_path, monkeypatch):
    """Without CPUs or memory, SLURM would grant one CPU per node for all of its GPU ranks: accelkit asks for whole
    nodes (all CPUs, and --mem=0: 22.05's --exclusive alone gives only the default memory per CPU)."""
    _write(tmp_path, monkeypatch, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "8")
    lines = _sbatch_lines(tmp_path / "job.sbatch")
    assert "#SBATCH --exclusive" in lines and "#SBATCH --mem=0" in lines
    assert not any("cpus-per-task" in line for line in lines)


def test_a_cpu_job_asking_nothing_gets_a_core_per_process(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "3")
    lines = _sbatch_lines(tmp_path / "job.sbatch")
    assert "#SBATCH --cpus-per-task=3" in lines and not any("exclusive" in line or "--mem" in line for line in lines)


def test_slurm_resources_account_qos_and_more_lines(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "8",
           "--cpus-per-node", "96", "--mem-per-node", "512GiB", "--account", "proj-42", "--qos", "high",
           "--sbatch-arg=--constraint=a100", "--sbatch-arg", "--comment=two words", "--sbatch-arg", "--contiguous")
    lines = _sbatch_lines(tmp_path / "job.sbatch")
    for expected in ("#SBATCH --cpus-per-task=96", "#SBATCH --mem=524288M", "#SBATCH --account=proj-42",
                     "#SBATCH --qos=high", "#SBATCH --constraint=a100", '#SBATCH --comment="two words"',
                     "#SBATCH --contiguous"):
        assert expected in lines, lines
    assert not any("exclusive" in line for line in lines)
    # whole nodes with a memory of one's own
    _write(tmp_path, monkeypatch, "--slurm", "job.sbatch", "--force", "--nodes", "2", "--gpus-per-node", "8",
           "--exclusive", "--mem-per-node", "1000GB")
    lines = _sbatch_lines(tmp_path / "job.sbatch")
    assert "#SBATCH --exclusive" in lines and "#SBATCH --mem=953675M" in lines and "#SBATCH --mem=0" not in lines


def test_slurm_setup_runs_before_the_launch_and_on_every_node(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "--cpu", "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "1",
           "--setup", "export STEP=one", "--setup", "export MARKER='a b'")
    text = (tmp_path / "job.sbatch").read_text()
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert text.index("export STEP=one\nexport MARKER='a b'\n") < text.index("exec python -m accelkit")
    # The node step runs the same lines again before its launcher (the batch step passes them on in its env).
    setup = text.split("export ACCELKIT_LAUNCH_REQUEST")[0].split("set -euo pipefail")[1]
    env = subprocess.run(["bash", "-c", setup + '\nprintf "%s|%s|%s" "$STEP" "$MARKER" "$ACCELKIT_NODE_SETUP"'],
                         capture_output=True, text=True, check=True).stdout
    assert env == "one|a b|export STEP=one\nexport MARKER='a b'"
    program = srun_argv(2, [])[srun_argv(2, []).index("-c") + 1]
    assert program.index('eval "${ACCELKIT_NODE_SETUP:-}"') < program.index("exec ")


def test_slurm_container_runs_every_node_in_the_image(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "8",
           "--container-image", "nvcr.io#nvidia/pytorch:24.05-py3")
    text = (tmp_path / "job.sbatch").read_text()
    subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    exported = subprocess.run(["bash", "-c", "\n".join(line for line in text.splitlines()
                                                       if line.startswith("export ACCELKIT_SRUN_ARGS"))
                               + '\nprintf %s "$ACCELKIT_SRUN_ARGS"'], capture_output=True, text=True,
                              check=True).stdout
    folder = str(tmp_path)
    assert shlex.split(exported) == ["--container-image=nvcr.io#nvidia/pytorch:24.05-py3",
                                     f"--container-mounts={folder}:{folder}", f"--container-workdir={folder}"]
    assert "export ACCELKIT_PYTHON=python3" in text  # the image's Python, not the batch node's
    options = step_options({"SLURM_CPUS_ON_NODE": "224", "ACCELKIT_SRUN_ARGS": exported})
    assert options == ["--cpus-per-task=224", *shlex.split(exported)]


def test_the_node_step_gets_the_jobs_cpus_per_task():
    """SLURM 22.05's srun does not take --cpus-per-task from the job: the step would bind the node's launcher (and
    every rank it starts) to one CPU. The batch step passes the job's own count (whole nodes: the node's CPUs)."""
    assert step_options({"SLURM_CPUS_PER_TASK": "96", "SLURM_CPUS_ON_NODE": "224"}) == ["--cpus-per-task=96"]
    assert step_options({"SLURM_CPUS_ON_NODE": "224"}) == ["--cpus-per-task=224"]
    assert step_options({}) == []


def test_trainjob_requests_cpus_memory_shm_and_a_shared_claim(tmp_path, monkeypatch):
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    _write(tmp_path, monkeypatch, "--backend", "fsdp", "--kubernetes", "tj.yaml", "--nodes", "2", "--gpus-per-node",
           "8", "--image", "img:1", "--cpus-per-node", "96", "--mem-per-node", "1TiB", "--shm-size", "64GiB",
           "--storage", "/checkpoints=ckpt-rwx", "--setup", "source /opt/venv/bin/activate",
           script=("train.py", "--output-dir", "/checkpoints/run1"))
    data = yaml.safe_load((tmp_path / "tj.yaml").read_text())
    job = TrainerV1alpha1TrainJob.from_dict(data)
    assert job.to_dict() == data  # every field is one the Trainer's API knows (nothing dropped)
    resources = job.spec.trainer.resources_per_node
    assert {k: q.actual_instance for k, q in resources.requests.items()} == {"cpu": "96", "memory": "1024Gi"}
    assert {k: q.actual_instance for k, q in resources.limits.items()} == {"memory": "1024Gi", "nvidia.com/gpu": "8"}
    [patch] = job.spec.runtime_patches
    [replicated] = patch.training_runtime_spec.template.spec.replicated_jobs
    assert replicated.name == "node"  # the torch-distributed runtime's job and container
    pod = replicated.template.spec.template.spec
    volumes = {volume.name: volume for volume in pod.volumes}
    assert volumes["dshm"].empty_dir.medium == "Memory" and volumes["dshm"].empty_dir.size_limit.actual_instance \
        == "64Gi"
    assert volumes["shared-0"].persistent_volume_claim.claim_name == "ckpt-rwx"
    [container] = pod.containers
    assert container.name == "node"
    assert {m.name: m.mount_path for m in container.volume_mounts} == {"dshm": "/dev/shm",
                                                                       "shared-0": "/checkpoints"}
    script = job.spec.trainer.command[2]
    assert script.index("source /opt/venv/bin/activate") < script.index("exec python -m accelkit.launch.cluster.node")


def qos_class(resources: dict) -> str:
    """Kubernetes' QoS class of a pod of one container with `resources` (only CPU and memory count)."""
    requests, limits = resources.get("requests", {}), resources.get("limits", {})
    counted = {name: value for name, value in {**requests, **limits}.items() if name in ("cpu", "memory")}
    if not counted:
        return "BestEffort"
    if all(name in limits and requests.get(name, limits[name]) == limits[name] for name in ("cpu", "memory")):
        return "Guaranteed"
    return "Burstable"


def _trainjob(folder, monkeypatch, *args: str) -> tuple[dict, dict]:
    """The TrainJob `accelkit launch ARGS` writes, read back with the Trainer's API models: (its resources per
    node, its /dev/shm volume)."""
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    _write(folder, monkeypatch, "--kubernetes", "tj.yaml", "--force", "--nodes", "2", "--image", "img", *args)
    data = yaml.safe_load((folder / "tj.yaml").read_text())
    assert TrainerV1alpha1TrainJob.from_dict(data).to_dict() == data  # every field one the Trainer's API knows
    pod = data["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    [shm] = [volume for volume in pod["template"]["spec"]["template"]["spec"]["volumes"] if volume["name"] == "dshm"]
    return data["spec"]["trainer"]["resourcesPerNode"], shm["emptyDir"]


def test_every_trainjob_asks_for_cpus_memory_and_shm(tmp_path, monkeypatch):
    """Asking nothing: a pod requesting only GPUs is BestEffort (evicted first, its ranks on whatever CPUs are left);
    each pod requests the node's processes x the documented per-process figures (a GPU rank: 8 CPUs, 32 GiB; a CPU
    rank: 1 and 4 GiB), without a memory limit (no OOM kill from a default), and /dev/shm gets half the memory (a
    container's default 64 MiB kills DataLoader workers and NCCL with SIGBUS)."""
    resources, shm = _trainjob(tmp_path, monkeypatch, "--gpus-per-node", "8")
    assert resources == {"requests": {"cpu": "64", "memory": "256Gi"}, "limits": {"nvidia.com/gpu": "8"}}
    assert qos_class(resources) == "Burstable" and shm == {"medium": "Memory", "sizeLimit": "128Gi"}
    resources, shm = _trainjob(tmp_path, monkeypatch, "--cpu", "--gpus-per-node", "3")
    assert resources == {"requests": {"cpu": "3", "memory": "12Gi"}} and shm["sizeLimit"] == "6Gi"
    assert qos_class(resources) == "Burstable"
    # what the user gives replaces the default it names; memory given is also the limit (the user's own figure)
    resources, shm = _trainjob(tmp_path, monkeypatch, "--gpus-per-node", "4", "--cpus-per-node", "48")
    assert resources["requests"] == {"cpu": "48", "memory": "128Gi"} and "memory" not in resources["limits"]
    resources, shm = _trainjob(tmp_path, monkeypatch, "--gpus-per-node", "4", "--mem-per-node", "100GiB")
    assert resources == {"requests": {"cpu": "32", "memory": "100Gi"},
                         "limits": {"memory": "100Gi", "nvidia.com/gpu": "4"}}
    assert shm["sizeLimit"] == "50Gi" and qos_class(resources) == "Burstable"
    resources, shm = _trainjob(tmp_path, monkeypatch, "--gpus-per-node", "4", "--shm-size", "100GiB")
    assert resources["requests"]["memory"] == "128Gi" and shm["sizeLimit"] == "100Gi"


def test_sharded_jobs_with_their_checkpoints_on_shared_storage_are_written(tmp_path, monkeypatch):
    """What the scattered-checkpoint refusal lets through: shared storage with the output folder in it (a template),
    shared storage with a script of one's own (its output folder unknown), one node, DDP (rank 0 alone saves), FSDP
    with full state dicts (gathered on rank 0), and SLURM (its working directory is the shared file system)."""
    project = init_project(tmp_path / "proj", "minimal", backend="fsdp").directory
    sky = ["--skypilot", "task.yaml", "--force", "--nodes", "2", "--gpus-per-node", "8", "--accelerator", "H100"]
    _write(project, monkeypatch, *sky, "--backend", "fsdp", "--storage", "/ckpt=gs://bucket",
           script=("train.py", "--output-dir=/ckpt/run1"))
    assert "/ckpt/run1" in (project / "task.yaml").read_text()
    (project / "probe.py").write_text(PROBE.read_text())
    _write(project, monkeypatch, *sky, "--backend", "fsdp", "--storage", "/ckpt=gs://bucket", script=("probe.py",))
    kube = ["--kubernetes", "tj.yaml", "--force", "--gpus-per-node", "8", "--image", "img"]
    _write(project, monkeypatch, *kube, "--nodes", "1", "--backend", "deepspeed")
    _write(project, monkeypatch, *kube, "--nodes", "2", "--backend", "ddp")
    _write(project, monkeypatch, *kube, "--nodes", "2", "--backend", "fsdp", "--state-dict", "full")
    _write(project, monkeypatch, "--slurm", "job.sbatch", "--nodes", "2", "--gpus-per-node", "8", "--backend", "fsdp")
