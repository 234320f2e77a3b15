"""The step clock's on_before_step callbacks run before each counted step, with the gradients in place, and not
for the step a limit stops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DATA

from accelkit.ranks.probes.results import read_results


@pytest.mark.slow  # a subprocess that imports torch
def test_before_step_sees_complete_gradients_and_stops_at_the_limit(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(DATA / "plan"), "ACCELKIT_PROBE_DIR": str(tmp_path),
           "ACCELKIT_PROBES": "before_step_probe", "ACCELKIT_PROBE_MAX_STEPS": "3"}
    proc = subprocess.run([sys.executable, "-m", "accelkit.ranks.bootstrap", str(DATA / "probes" / "plain_gan.py")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (result,) = read_results(tmp_path, "before")
    clock_steps = [(e["clock_steps"], e["is_clock"]) for e in result["seen"]]
    # the discriminator (the clock) and the generator each step three times; the 4th clock step is stopped first
    assert clock_steps == [(0, True), (1, False), (1, True), (2, False), (2, True), (3, False)]
    assert all(e["grads"] and e["source"] == "torch" for e in result["seen"])
