"""`--measure` on a machine with GPUs (there is none here): the launch is a GPU launch of the recommended
strategy, ranks report the allocator's peak, and the plan's total per GPU stands beside it."""

from __future__ import annotations

import json
from pathlib import Path

from accelkit.hardware import LocalGpus
from accelkit.launch import RunOutcome
from accelkit.plan import api, spine
from accelkit.plan.measure import probe

GiB = 2**30


def test_the_probe_reports_the_allocators_peak_on_gpus(monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 12 * GiB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 5 * GiB)
    assert probe._cuda_peak() == {"cuda_max_allocated": 12 * GiB, "cuda_allocated": 5 * GiB}


def test_measure_launches_on_gpus_and_compares_the_peak(monkeypatch, tmp_path: Path) -> None:
    launched = {}

    def fake_launch(options, script, args, cpu, probe_dir, probe, max_steps, command_line, stall_timeout=None):
        launched.update(options=options, script=script, args=args, cpu=cpu, probe=probe, max_steps=max_steps)
        shapes = [["w", [1024, 1024], True]]
        for rank in range(2):  # what two GPU ranks of a DDP run would write
            record = {"model": "Net", "backend": "ddp", "world_size": 2, "rank": rank, "shapes": shapes,
                      "groups": [["w"]], "parameters": 4 * 2**20, "gradients": 4 * 2**20,
                      "optimizer": 8 * 2**20 + 4, "buffers": 4 * 2**20, "activations": None, "inputs": None,
                      "cuda_max_allocated": 30 * 2**20, "cuda_allocated": 20 * 2**20}
            (Path(probe_dir) / f"plan.rank{rank}.json").write_text(json.dumps({"reason": "step limit",
                                                                             "records": [record]}))
        return RunOutcome("ok", 0, 1.0)

    monkeypatch.setattr("accelkit.hardware.local_gpus", lambda: LocalGpus(2, 80 * 10**9, "NVIDIA H100 80GB"))
    monkeypatch.setattr(spine, "run_measurement", fake_launch)
    script = tmp_path / "train.py"
    script.write_text("print('train')\n")
    result = api.plan_memory(api.PlanRequest(params="1M", measure_script=str(script), script_args=("--epochs", "1"),
                                             command_line="accelkit plan --params 1M --measure train.py"))
    assert launched["cpu"] is False and launched["options"].backend == "ddp" and launched["options"].num_processes == 2
    assert launched["probe"] == "accelkit.plan.measure.probe" and launched["max_steps"] == 1
    assert launched["args"] == ("--epochs", "1")
    peaks = [r["figures"]["GPU peak"] for r in result.json["measurement"]["ranks"]]
    assert [p["measured"] for p in peaks] == [30 * 2**20] * 2
    assert peaks[0]["planned"] == next(s for s in result.json["strategies"] if s["name"] == "ddp")["per_gpu_bytes"][
        "total"]
    assert "detected: NVIDIA H100 80GB" in "\n".join(result.lines)
    assert any("GPU peak" in line for line in result.lines) and "(GPUs)" in "\n".join(result.lines)
