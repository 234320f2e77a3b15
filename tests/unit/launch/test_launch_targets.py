"""`accelkit launch --skypilot/--kubernetes`: the task and the TrainJob carry the same typed job as the SLURM script
(one request, one per-node command), in each scheduler's format. The TrainJob is read back with the Kubeflow
Trainer's published API models; SkyPilot's own parser and the two-node runs are in
tests/integration/test_cluster_targets.py."""

from __future__ import annotations

import subprocess

import pytest
import yaml
from click.testing import CliRunner
from helpers import DATA

from accelkit.cli import cli
from accelkit.errors import AccelkitError
from accelkit.launch.cluster.node import check_scheduler_shape, node_request
from accelkit.launch.cluster.slurm_job import NODE_PROGRAM
from accelkit.launch.cluster.targets.accelerators import canonical_accelerator
from accelkit.launch.request import LaunchRequest

PROBE = DATA / "launch" / "probe.py"


def _write(tmp_path, monkeypatch, *args: str):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text(PROBE.read_text())
    result = CliRunner().invoke(cli, ["launch", *args], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result


def test_skypilot_task_for_two_h100_nodes(tmp_path, monkeypatch):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    from accelkit.launch.build_plan import prepare_launch

    result = _write(tmp_path, monkeypatch, "--backend", "deepspeed", "--zero-stage", "3", "--skypilot", "task.yaml",
                    "--nodes", "2", "--gpus-per-node", "8", "--accelerator", "h100", "--stall-timeout", "600",
                    "--storage", "/checkpoints=s3://my-bucket", "train.py", "--lr", "1e-4")
    # the job board's key is made at launch and passed as SkyPilot's secret: nowhere in the task file
    assert ('ACCELKIT_JOB_KEY="$(python3 -c \'import secrets; print(secrets.token_hex(16))\')" sky launch -c accelkit '
            'task.yaml --secret ACCELKIT_JOB_KEY') in result.stdout
    task = yaml.safe_load((tmp_path / "task.yaml").read_text())
    assert (task["num_nodes"], task["resources"], task["workdir"]) == (2, {"accelerators": "H100:8"}, str(tmp_path))
    assert task["setup"].startswith('pip install "torch==') and '"deepspeed==' in task["setup"]
    assert task["setup"].rstrip().endswith("pip install ~/.accelkit/src")  # accelkit from this checkout
    run = task["run"]
    subprocess.run(["bash", "-n"], input=run, text=True, check=True)
    for variable in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert f'"${variable}"' in run
    assert "head -n1" in run and "python -m accelkit.launch.cluster.node" in run and "--stall-timeout 600" in run
    assert "--main-process-port 29500 --job-board-port 29501" in run
    assert task["secrets"] == {"ACCELKIT_JOB_KEY": None} and "ACCELKIT_JOB_KEY" not in task["envs"]
    assert "--secret ACCELKIT_JOB_KEY" in (tmp_path / "task.yaml").read_text().splitlines()[1]  # the header says so
    config = yaml.safe_load((tmp_path / "task.accelerate.yaml").read_text())
    assert (config["distributed_type"], config["num_machines"], config["num_processes"]) == ("DEEPSPEED", 2, 16)

    request = LaunchRequest.from_json(task["envs"]["ACCELKIT_LAUNCH_REQUEST"])
    assert request.target.script == "train.py"  # relative: SkyPilot runs it in the uploaded workdir
    mine = node_request(request, 1, "10.1.2.3", 29500)  # what node 1 runs, read with Accelerate's own parser
    prepared = prepare_launch(mine, config_path=tmp_path / "node1.yaml", check_hardware=False)
    args = launch_command_parser().parse_args(prepared.plan.launcher_args())
    assert (args.machine_rank, args.main_process_ip, args.main_process_port) == (1, "10.1.2.3", 29500)
    args, _, _ = _validate_launch_command(args)
    assert args.use_deepspeed and args.num_machines == 2 and args.num_processes == 16
    assert args.deepspeed_multinode_launcher == "standard"


def test_trainjob_is_read_by_the_trainers_api_models(tmp_path, monkeypatch):
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob

    result = _write(tmp_path, monkeypatch, "--backend", "fsdp", "--kubernetes", "trainjob.yaml", "--nodes", "4",
                    "--gpus-per-node", "8", "--image", "ghcr.io/me/train:1", "--job-name", "llama-ft",
                    "--storage", "/checkpoints=ckpt-rwx", "train.py")
    assert "kubectl apply -f trainjob.yaml" in result.stdout
    # the job board's key: a Secret made once where the job is submitted, never in the TrainJob
    assert ("kubectl create secret generic llama-ft-job-key --from-literal=key=\"$(python3 -c 'import secrets; "
            "print(secrets.token_hex(16))')\"") in result.stdout
    text = (tmp_path / "trainjob.yaml").read_text()
    data = yaml.safe_load(text)
    job = TrainerV1alpha1TrainJob.from_dict(data)
    assert job.to_dict() == data  # every field is one the Trainer's API knows (nothing dropped)
    patch = data["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    # SIGTERM, then SIGKILL after the grace: the ranks' save (--preemption-grace, 120 s) plus a margin
    assert patch["template"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 150
    assert (job.api_version, job.kind, job.metadata.name) == ("trainer.kubeflow.org/v1alpha1", "TrainJob", "llama-ft")
    assert job.spec.runtime_ref.name == "torch-distributed"
    trainer = job.spec.trainer
    assert (trainer.num_nodes, trainer.num_proc_per_node, trainer.image) == (4, 8, "ghcr.io/me/train:1")
    assert {name: q.actual_instance for name, q in trainer.resources_per_node.limits.items()} == {"nvidia.com/gpu": "8"}
    assert trainer.command[:2] == ["bash", "-c"]
    script = trainer.command[2]
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    for variable in ("PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", "PET_NPROC_PER_NODE"):
        assert f"${variable}" in script
    env = {item.name: item for item in trainer.env}
    request = LaunchRequest.from_json(env["ACCELKIT_LAUNCH_REQUEST"].value)
    key = env["ACCELKIT_JOB_KEY"]
    assert key.value is None and key.value_from.secret_key_ref.to_dict() == {"name": "llama-ft-job-key", "key": "key"}
    assert "kubectl create secret generic llama-ft-job-key" in text.splitlines()[1]  # the header says it too
    assert (request.options.num_machines, request.options.num_processes, request.cpu) == (4, 32, False)


def test_a_cpu_trainjob_asks_for_cores_not_gpus(tmp_path, monkeypatch):
    _write(tmp_path, monkeypatch, "--cpu", "--kubernetes", "tj.yaml", "--nodes", "2", "--gpus-per-node", "2",
           "--image", "img", "train.py")
    trainer = yaml.safe_load((tmp_path / "tj.yaml").read_text())["spec"]["trainer"]
    # a core and 4 GiB per rehearsed rank (node_resources.CPU_RANK_*)
    assert trainer["resourcesPerNode"] == {"requests": {"cpu": "2", "memory": "8Gi"}} and trainer["numProcPerNode"] == 2


def test_every_target_runs_the_same_node_launcher(tmp_path, monkeypatch):
    """SLURM's srun program, SkyPilot's run block and the TrainJob's command are one per-node command."""
    _write(tmp_path, monkeypatch, "--cpu", "--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "1",
           "train.py")
    _write(tmp_path, monkeypatch, "--cpu", "--kubernetes", "tj.yaml", "--nodes", "2", "--gpus-per-node", "1",
           "--image", "img", "train.py")
    sky_run = yaml.safe_load((tmp_path / "task.yaml").read_text())["run"]
    kube_run = yaml.safe_load((tmp_path / "tj.yaml").read_text())["spec"]["trainer"]["command"][2]
    for text in (NODE_PROGRAM, sky_run, kube_run):
        assert "-m accelkit.launch.cluster.node --machine-rank" in text and '--node-name "' in text


def test_accelerator_names_are_skypilots():
    assert canonical_accelerator("h100") == "H100"
    assert canonical_accelerator("a100-80gb") == "A100-80GB"
    assert canonical_accelerator("TPU-v5p-8") == "tpu-v5p-8"
    with pytest.raises(AccelkitError, match="unknown accelerator 'H1000'") as error:
        canonical_accelerator("H1000")
    assert "sky gpus list" in error.value.hint


def test_a_node_refuses_a_shape_the_job_was_not_written_for():
    request = LaunchRequest.from_json(LaunchRequest(target=_target()).to_json())
    request.options.num_machines, request.options.num_processes = 2, 16
    check_scheduler_shape(request, "2", "8")
    check_scheduler_shape(request, "2", "0")  # SkyPilot's GPU count of a CPU node: nothing to compare
    with pytest.raises(AccelkitError, match="the scheduler runs 3 nodes but the job was written for 2"):
        check_scheduler_shape(request, "3", "8")
    with pytest.raises(AccelkitError, match="runs 4 processes per node but the job was written for 8"):
        check_scheduler_shape(request, "2", "4")


def _target():
    from accelkit.launch.launch_plan import LaunchTarget

    return LaunchTarget(script="train.py")


def test_a_node_of_a_cluster_job_launches_as_machine_rank_does(tmp_path, monkeypatch):
    """A node's launch (the job's request with its rank, address and port filled in) is the launch
    `accelkit launch --num-machines 2 --num-processes 16 --machine-rank 1 ...` plans on a bare machine."""
    from dataclasses import replace

    from accelkit.configs.options import ConfigOptions
    from accelkit.launch.build_plan import prepare_launch

    _write(tmp_path, monkeypatch, "--backend", "fsdp", "--kubernetes", "tj.yaml", "--nodes", "2", "--gpus-per-node",
           "8", "--image", "img", "--storage", "/checkpoints=ckpt-rwx", "train.py", "--lr", "1e-4")
    trainer = yaml.safe_load((tmp_path / "tj.yaml").read_text())["spec"]["trainer"]
    cluster = LaunchRequest.from_json(trainer["env"][0]["value"])
    node = prepare_launch(node_request(cluster, 1, "10.0.0.1", 29400), config_path=tmp_path / "node.yaml",
                          check_hardware=False)
    bare_request = replace(cluster, for_cluster=False, source_labels={}, options=ConfigOptions(
        backend="fsdp", num_machines=2, num_processes=16, machine_rank=1, main_process_ip="10.0.0.1",
        main_process_port=29400))
    bare = prepare_launch(bare_request, config_path=tmp_path / "bare.yaml", check_hardware=False)
    assert node.plan.launcher_args()[2:] == bare.plan.launcher_args()[2:]  # all but --config_file PATH
    assert node.plan.config.to_accelerate_dict() == bare.plan.config.to_accelerate_dict()
