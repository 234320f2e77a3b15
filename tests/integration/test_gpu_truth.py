"""benchmarks/gpu_truth.py --cpu-plumbing: the harness's own plumbing, end to end on CPU (plan against a worker
process that really trains, a template trained through `accelkit launch`, merged and loaded back, the collective
check through a launch, the checkpoint stall of the causal-lm template synchronous and asynchronous), and no GPU
figure in what it writes. The bench section is `accelkit bench`, tested in
test_bench.py; it is left out here to keep this test within the slow-test budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_plumbing_runs_the_harness_and_claims_no_gpu_figure(tmp_path: Path) -> None:
    out = tmp_path / "truth.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--cpu-plumbing", "--sections",
                           "plan,nccl,templates,checkpoint", "--out", str(out), "--work", str(tmp_path / "work")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["mode"] == "cpu-plumbing" and result["gpu_figures"] is False and result["device"]["gpus"] == 0
    plan = result["sections"]["plan"]
    assert [r["strategy"] for r in plan] == ["single", "fsdp2"]
    for row in plan:
        assert "error" not in row, row
        assert row["planned_bytes"] > 0 and row["oom"] is False and row["step_s"] > 0
        assert row["allocated_bytes"] is None and row["reserved_bytes"] is None and row["measured_on"] is None
        assert "error_allocated_pct" not in row
    [collective] = result["sections"]["nccl"]
    assert collective["backend"] == "gloo" and collective["all_reduce_ok"] is True
    # launch sets the NCCL flight-recorder variables for GPU launches only (gpu_debug_env); the GPU mode checks them
    assert collective["flight_recorder_env"] is False and "TORCH_NCCL_TRACE_BUFFER_SIZE" in collective["env"]
    [template] = result["sections"]["templates"]
    assert template["ok"] is True and template["equal_tensors"] > 0, template
    sync, asynchronous = result["sections"]["checkpoint"]
    assert (sync["mode"], asynchronous["mode"]) == ("sync", "async") and sync["device"] == "cpu"
    assert sync["checkpoint_bytes"] > 0 and sync["plain_step_s"] > 0
    # A synchronous save is complete before the next step starts; an asynchronous one is still being written.
    assert sync["started_before_written"] == "0/3"
    assert "checkpoint stall (causal-lm, 1 process)" in done.stdout
    assert "no GPU figure was measured" in done.stdout and "not measured" in done.stdout
