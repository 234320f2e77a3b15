"""The step clock counts real optimizer steps (not micro-batches, not ZeRO's per-group inner steps) on 2 ranks
under ddp, fsdp and deepspeed, and a step limit stops every rank cleanly at the same step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.ranks.probes.results import read_results

PROBES = DATA / "probes"
LAUNCH = """
import sys
from accelkit.configs import ConfigOptions
from accelkit.launch.launch_plan import LaunchTarget
from accelkit.launch.request import LaunchRequest
from accelkit.launch.supervised import run_request
backend, script, *args = sys.argv[1:]
request = LaunchRequest(target=LaunchTarget(script, tuple(args)), cpu=True, probes=("count_probe",),
                        options=ConfigOptions(backend=backend, num_processes=2))
sys.exit(run_request(request))
"""


def launch(backend: str, tmp_path: Path, *args: str, max_steps: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(PROBES), "ACCELKIT_PROBE_DIR": str(tmp_path)}
    if max_steps is not None:
        env["ACCELKIT_PROBE_MAX_STEPS"] = str(max_steps)
    return subprocess.run([sys.executable, "-c", LAUNCH, backend, str(PROBES / "accumulate_train.py"), *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "deepspeed"])
def test_steps_are_counted_per_rank_and_a_limit_stops_every_rank(backend: str, tmp_path: Path) -> None:
    # accumulation 2 over 12 micro-batches = 6 real steps; the limit stops the script after 4 of them.
    proc = launch(backend, tmp_path, "--steps", "6", "--accumulation", "2", max_steps=4)
    assert proc.returncode == 0, proc.stderr[-3000:]
    printed = [line for line in proc.stdout.splitlines() if line.startswith("STEP")]
    assert printed == ["STEP 1", "STEP 2", "STEP 3", "STEP 4"], proc.stdout
    assert "DONE" not in proc.stdout
    ranks = read_results(tmp_path, "count")
    assert len(ranks) == 2
    source = "deepspeed" if backend == "deepspeed" else "accelerate"
    for result in ranks:
        assert result["reason"] == "step limit"
        assert [e["clock_steps"] for e in result["events"]] == [1, 2, 3, 4]
        assert {e["source"] for e in result["events"]} == {source}
        assert all(e["is_clock"] for e in result["events"])


def test_a_script_that_ends_first_reports_script_end(tmp_path: Path) -> None:
    proc = launch("ddp", tmp_path, "--steps", "3", "--accumulation", "1", max_steps=10)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DONE" in proc.stdout
    for result in read_results(tmp_path, "count"):
        assert result["reason"] == "script end" and len(result["events"]) == 3


def test_plain_torch_two_optimizers_one_process(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(PROBES), "ACCELKIT_PROBE_DIR": str(tmp_path),
           "ACCELKIT_PROBES": "count_probe", "ACCELKIT_PROBE_MAX_STEPS": "3"}
    proc = subprocess.run([sys.executable, "-m", "accelkit.ranks.bootstrap", str(PROBES / "plain_gan.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["ITER", "1", "ITER", "2", "ITER", "3"]
    (result,) = read_results(tmp_path, "count")
    # The first optimizer to step (the discriminator) is the clock; the generator's steps are reported too.
    assert [(e["clock_steps"], e["is_clock"]) for e in result["events"]] == [
        (1, True), (1, False), (2, True), (2, False), (3, True), (3, False)]
    assert json.loads(json.dumps(result))["reason"] == "step limit"
