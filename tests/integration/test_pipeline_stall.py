"""A pipeline hang (issue 34, item 3): two gloo ranks run a GPipe pipeline through `accelkit launch --cpu`, stage 1
hangs inside its forward at the third step, and the stall watchdog stops the job with each stage's stack: stage 1's
sleeping line, stage 0 waiting in the pipeline's point-to-point receive, one Error line with its Hint, exit 124 and
no rank left running."""

from __future__ import annotations

import re

import psutil
import pytest
from helpers import REPO_ROOT, run_accelkit

SCRIPT = REPO_ROOT / "tests" / "data" / "pipeline" / "stalled_stage.py"
pytestmark = pytest.mark.slow


def test_a_hanging_pipeline_stage_is_stopped_with_every_stage_s_stack(tmp_path):
    proc = run_accelkit("launch", "--cpu", "--num-processes", "2", "--stall-timeout", "15", str(SCRIPT),
                        cwd=tmp_path, timeout=240)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 124, out
    assert "step 1 done on rank 0" in out and "step 2 done" not in out  # it hung where the script makes it hang
    pids = {int(rank): int(pid) for rank, pid in re.findall(r"accelkit: rank (\d) \(pid (\d+)\), main thread", out)}
    assert set(pids) == {0, 1}, out
    stage0, stage1 = out.split("accelkit: rank 1 (pid")[0], out.split("accelkit: rank 1 (pid")[1].split("Error:")[0]
    assert "accelkit: rank 0 (pid" in stage0 and "in _wait_batch_p2p" in stage0 and "schedule.step(x)" in stage0
    assert "in hang_in_forward" in stage1 and "time.sleep(3600)" in stage1
    errors = [line for line in out.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, out
    assert ("rank 1 is not in any collective (it is at " in errors[0] and "in hang_in_forward) while rank 0 waits in "
            "the pipeline's send/recv to a neighbouring stage (_wait_batch_p2p)" in errors[0]
            and errors[0].endswith("the others wait for rank 1")), errors[0]
    hint = out.splitlines()[out.splitlines().index(errors[0]) + 1]
    assert hint.startswith("  Hint: look at the line rank 1 is stuck at") and "--stall-timeout (now 15 s" in hint
    assert "Traceback" not in out
    alive = [pid for pid in pids.values()
             if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"ranks left running: {alive}"
