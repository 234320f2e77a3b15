"""The Ray target's pure parts: the job each worker runs (argv, environment), the resources it asks for, and the
preflight verdicts on what the nodes answered."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.configs import ConfigOptions
from accelkit.errors import AccelkitError
from accelkit.launch.build_plan import prepare_launch
from accelkit.launch.launch_plan import LaunchTarget
from accelkit.launch.raytrain.driver import build_job, rank_argv
from accelkit.launch.raytrain.job import RayJob, RayOptions, user_environment
from accelkit.launch.raytrain.readiness import check_nodes, check_resources
from accelkit.launch.request import LaunchRequest


def job(**changes) -> RayJob:
    fields = {"address": "10.0.0.1:6379", "num_workers": 4, "use_gpu": True, "cpus_per_worker": 2, "max_failures": 1,
              "storage": None, "name": "t", "rank_argv": ("train.py",), "cwd": "/shared/run",
              "script_path": "/shared/run/train.py"}
    return RayJob(**{**fields, **changes})


def prepared(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, cpu: bool, **options):
    (tmp_path / "train.py").write_text("print('hi')\n")
    monkeypatch.chdir(tmp_path)
    request = LaunchRequest(target=LaunchTarget("train.py", ("--lr", "1e-3")), options=ConfigOptions(**options),
                            cpu=cpu, for_cluster=True)
    return request, prepare_launch(request, check_hardware=False)


def test_a_rehearsal_runs_the_bootstrap_with_the_scripts_arguments(tmp_path, monkeypatch) -> None:
    request, launch = prepared(tmp_path, monkeypatch, cpu=True, backend="fsdp", num_processes=2)
    try:
        assert rank_argv(launch.plan) == ("-m", "accelkit.ranks.bootstrap", "train.py", "--lr", "1e-3")
        ray_job = build_job(request, RayOptions("auto"), launch.plan, tmp_path)
    finally:
        import shutil

        shutil.rmtree(launch.temp_dir)
    assert ray_job.num_workers == 2 and not ray_job.use_gpu
    assert ray_job.env["ACCELKIT_REHEARSAL"] == "fsdp" and ray_job.env["ACCELERATE_USE_CPU"] == "true"
    assert ray_job.script_path == str(tmp_path / "train.py")


def test_a_gpu_fsdp_job_hands_accelerates_own_variables_to_every_worker(tmp_path, monkeypatch) -> None:
    request, launch = prepared(tmp_path, monkeypatch, cpu=False, backend="fsdp", num_processes=8,
                               mixed_precision="bf16")
    try:
        ray_job = build_job(request, RayOptions("auto", cpus_per_worker=4), launch.plan, tmp_path)
    finally:
        import shutil

        shutil.rmtree(launch.temp_dir)
    assert rank_argv(launch.plan) == ("train.py", "--lr", "1e-3")  # nothing patched on GPUs
    assert ray_job.use_gpu and ray_job.resources_per_worker() == {"CPU": 4.0, "GPU": 1.0}
    assert ray_job.env["ACCELERATE_USE_FSDP"] == "true" and ray_job.env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    for launcher_only in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES"):
        assert launcher_only not in ray_job.env  # Ray sets them per worker


def test_the_users_environment_travels_without_this_machines_own() -> None:
    env = {"HF_HOME": "/data/hf", "WANDB_PROJECT": "p", "CUDA_VISIBLE_DEVICES": "0", "RAY_ADDRESS": "x",
           "SLURM_JOB_ID": "1", "HOSTNAME": "login1", "RANK": "3", "PATH": "/login/bin", "VIRTUAL_ENV": "/login/venv",
           "GLOO_SOCKET_IFNAME": "eth1"}
    assert user_environment(env) == {"HF_HOME": "/data/hf", "WANDB_PROJECT": "p"}


def test_resources_short_in_total_or_per_node_are_named_with_the_fix() -> None:
    with pytest.raises(AccelkitError, match=r"has 3 GPUs; 4 workers x 1 need 4") as err:
        check_resources(job(), {"CPU": 64.0, "GPU": 3.0}, [{"CPU": 64.0, "GPU": 3.0}])
    assert err.value.hint == "pass --num-processes 3"
    with pytest.raises(AccelkitError, match="no node of the Ray cluster can hold one worker"):
        check_resources(job(cpus_per_worker=8), {"CPU": 32.0, "GPU": 4.0}, [{"CPU": 4.0, "GPU": 1.0}] * 8)
    check_resources(job(), {"CPU": 16.0, "GPU": 4.0}, [{"CPU": 8.0, "GPU": 2.0}] * 2)  # fits: no error


def node(ip: str = "10.0.0.2", **changes) -> dict:
    answer = {"node": ip, "versions": {"torch": "2.13.0", "accelerate": "1.15.0", "accelkit": "0.1.0", "ray": "2.60.0"},
              "cwd": True, "shared": True, "script": "abc"}
    return {**answer, **changes}


@pytest.mark.parametrize(("answer", "words"), [
    (node(versions={**node()["versions"], "torch": "2.9.0"}), "node 10.0.0.2 has torch 2.9.0; this machine has 2.13.0"),
    (node(versions={**node()["versions"], "accelkit": None}), "node 10.0.0.2 has accelkit not installed"),
    (node(cwd=False), "node 10.0.0.2 has no folder /shared/run"),
    (node(shared=False), "node 10.0.0.2 does not share the working folder /shared/run"),
    (node(script="other"), "node 10.0.0.2 has another /shared/run/train.py"),
    (node(script=None), "node 10.0.0.2 has no /shared/run/train.py"),
])
def test_a_node_that_differs_is_named_before_any_worker_starts(answer: dict, words: str) -> None:
    with pytest.raises(AccelkitError, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_nodes(job(), [node("10.0.0.1"), answer], node("10.0.0.1"))


def test_nodes_that_agree_pass() -> None:
    check_nodes(job(), [node("10.0.0.1"), node("10.0.0.2")], node("10.0.0.1"))


class _GroupError(Exception):
    """Ray Train's WorkerGroupError in shape: a failure per rank."""

    def __init__(self, failures: dict) -> None:
        super().__init__("Training failed due to worker errors")
        self.worker_failures = failures


def test_the_first_failing_rank_is_the_exit_status(capsys) -> None:
    from accelkit.launch.raytrain.driver import _failure_status
    from accelkit.launch.raytrain.rank_process import RankFailed

    wrapped = RuntimeError("user code failed")
    wrapped.__cause__ = RankFailed(1, "10.0.0.2", 7, when=100.0)
    later = RankFailed(0, "10.0.0.1", 1, when=101.0)  # stopped because rank 1 was gone
    assert _failure_status(_GroupError({0: later, 1: wrapped})) == 7
    assert capsys.readouterr().err.strip() == "Error: rank 1 on node 10.0.0.2 failed first (exit status 7)"


def test_a_lost_worker_is_named_with_its_node(capsys) -> None:
    from accelkit.launch.raytrain.driver import _failure_status

    lost = RuntimeError("A worker health check failed.")
    lost.__cause__ = RuntimeError("The actor died unexpectedly.\n\tclass_name: RayTrainWorker\n\tpid: 4242\n"
                                  "\tip: 10.0.0.3")
    assert _failure_status(_GroupError({1: lost})) == 1
    err = capsys.readouterr().err
    assert "Error: Ray lost the worker of rank 1 (node 10.0.0.3, pid 4242): A worker health check failed." in err
    assert "--max-restarts N" in err
