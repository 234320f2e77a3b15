"""`accelkit plan PROJECT --measure train.py`: the user's own script (an accelkit project, the minimal template:
the quickest to start) runs one optimizer step under the planned launch (a 2-rank CPU rehearsal of FSDP2 here),
and the plan stands beside the measurement. The transformers models are measured in test_plan_measured.py."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import run_accelkit

from accelkit.scaffold import init_project


def test_measure_a_project_script(tmp_path: Path) -> None:
    project = init_project(tmp_path / "run", "minimal", backend="fsdp")
    proc = run_accelkit("plan", str(project.directory), "--gpus", "2", "--gpu-memory", "16GiB", "--strategy",
                        "fsdp-full", "--measure", str(project.directory / "train.py"), "--json", "--",
                        "--max-steps", "3", timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    data = json.loads(proc.stdout)  # the script's own output went to stderr
    # MODEL is the project: its template's model and per-device batch
    assert "template minimal" in data["model"]["source"] and data["model"]["name"] == "MLPClassifier"
    assert data["training"]["micro_batch"] == 32
    assert data["recommendation"]["launch_command"].endswith(str(project.directory / "train.py"))
    measurement = data["measurement"]
    assert measurement["strategy"] == "fsdp-full" and measurement["device"] == "cpu"
    assert sorted(r["rank"] for r in measurement["ranks"]) == [0, 1]
    for rank in measurement["ranks"]:
        assert set(rank["figures"]) == {"parameters", "gradients", "optimizer", "activations"}
        assert all(f["measured"] > 0 for f in rank["figures"].values())
    assert measurement["worst_error"]["model_states"] <= 0.02
    assert measurement["worst_error"]["activations"] <= 0.15
    assert "step 1" not in proc.stdout  # the script's logging is on stderr, not mixed into the JSON
