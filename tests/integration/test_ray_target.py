"""`accelkit launch --ray`: the minimal template on a real two-node Ray cluster (tests/helpers/ray_cluster.py),
one Ray Train worker per rank, each on its own node. The same final weights as a plain 2-rank launch; a worker
SIGKILLed after a checkpoint is restarted by Ray (--max-restarts 1) and the run resumes to the same weights; the
preflight refusals come before any worker starts."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import DATA, run_accelkit
from helpers.faults import run_fault
from helpers.ray_cluster import two_node_cluster

from accelkit.scaffold import init_project

KILL_WORKER = DATA / "ray" / "kill_worker_at_step.py"
TRAIN_ARGS = ["--max-steps", "16", "--num-samples", "256", "--per-device-batch-size", "8", "--checkpoint-every",
              "4", "--log-every", "4", "--lr-scheduler", "constant", "--warmup-steps", "0"]
# One worker per node: each node has 2 CPUs, each worker asks for 2.
RAY_LAUNCH = ["launch", "--cpu", "--num-processes", "2", "--ray-cpus-per-worker", "2"]


@pytest.fixture(scope="module")
def ray_address() -> str:
    with two_node_cluster(cpus_per_node=2) as address:
        yield address


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The final weights of a plain 2-rank launch."""
    project = init_project(tmp_path_factory.mktemp("plain") / "proj", "minimal", backend="ddp").directory
    run_accelkit("launch", "--cpu", "--num-processes", "2", "train.py", *TRAIN_ARGS, cwd=project, check=True,
                 timeout=300)
    return final_weights(project / "outputs")


def final_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "final" / "model.safetensors")


def assert_same_weights(found: dict, expected: dict) -> None:
    import torch

    assert found.keys() == expected.keys()
    for key in expected:
        assert torch.allclose(found[key], expected[key], atol=1e-6, rtol=0), key


def test_ray_workers_on_two_nodes_train_the_plain_launchs_weights(tmp_path: Path, ray_address: str,
                                                                    reference: dict) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    proc = run_accelkit(*RAY_LAUNCH, "--ray", ray_address, "train.py", *TRAIN_ARGS, cwd=project, timeout=400)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert f"Ray Train job on {ray_address}: 2 workers x (2 CPU)" in text
    assert "effective batch 16 = 8 per device x 2 processes" in text  # Accelerate found Ray's 2-rank group
    assert_same_weights(final_weights(project / "outputs"), reference)
    assert not list(project.glob(".accelkit-ray-probe-*"))  # the shared-storage probe is gone


def test_a_killed_worker_is_restarted_by_ray_and_the_run_resumes_to_the_same_weights(
        tmp_path: Path, ray_address: str, reference: dict) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    marker = tmp_path / "killed"
    env = {"KILL_RANK": "1", "KILL_STEP": "6", "KILL_MARKER": str(marker)}
    proc = run_accelkit(*RAY_LAUNCH, "--ray", ray_address, "--max-restarts", "1", str(KILL_WORKER), "train.py",
                        *TRAIN_ARGS, "--resume-from-checkpoint", "latest", cwd=project, env=env, timeout=500)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert marker.is_file(), text  # the worker of rank 1 was killed at step 6 of the first attempt
    assert re.search(r"resumed from \S*checkpoint-4 at step 4", text), text  # the group Ray started again
    assert_same_weights(final_weights(project / "outputs"), reference)


def test_a_failing_rank_is_the_jobs_exit_status_with_its_node(tmp_path: Path, ray_address: str) -> None:
    script = tmp_path / "fail.py"
    script.write_text("import os, sys\nfrom accelerate import Accelerator\nacc = Accelerator()\n"
                      "acc.wait_for_everyone()\nsys.exit(7 if acc.process_index == 1 else 0)\n")
    proc = run_accelkit(*RAY_LAUNCH, "--ray", ray_address, str(script), cwd=tmp_path, timeout=300)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    assert re.search(r"Error: rank 1 on node \S+ failed first \(exit status 7\)", proc.stderr), proc.stderr


def test_preflight_refusals_come_before_any_worker(tmp_path: Path, ray_address: str) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('never runs')\n")
    # More CPUs than the cluster has: 3 workers x 2 CPUs on 2 nodes of 2 CPUs.
    result = run_fault(["launch", "--cpu", "--num-processes", "3", "--ray-cpus-per-worker", "2", "--ray",
                        ray_address, str(script)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("the Ray cluster has 4 CPUs; 3 workers x 2 need 6")
    assert "never runs" not in result.stdout + result.stderr
    # No cluster at that address.
    result = run_fault(["launch", "--cpu", "--num-processes", "2", "--ray", f"127.0.0.1:{_closed_port()}",
                        str(script)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("no Ray cluster answers at 127.0.0.1:")


def _closed_port() -> int:
    from accelkit.launch.ports import free_port

    return free_port()
