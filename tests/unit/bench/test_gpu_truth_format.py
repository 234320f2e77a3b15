"""benchmarks/gpu_truth.py: the GPU mode's table and JSON, on a result file written by hand to the schema
(tests/data/gpu_truth/recorded_format.json says so in its provenance: it is a format fixture, not a measurement),
and the rule that a run without a GPU never shows a GPU figure."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RECORDED = ROOT / "tests" / "data" / "gpu_truth" / "recorded_format.json"


def harness():
    spec = importlib.util.spec_from_file_location("gpu_truth", ROOT / "benchmarks" / "gpu_truth.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_recorded_gpu_result_prints_every_section() -> None:
    recorded = json.loads(RECORDED.read_text())
    assert recorded["schema"] == harness().SCHEMA and "NOT measured" in recorded["provenance"]
    text = harness().format_result(recorded)
    assert text.splitlines()[0] == ("accelkit GPU truth, 2026-11-24: NVIDIA H100 80GB HBM3 (cuda, 1 GPU), mode gpu")
    assert "provenance: recorded-format" in text  # a reader of the table sees it is not a measurement
    assert ("| llama-1b | single | bf16-mixed | 512 | 2 | off | adamw | 20.00 | 19.00 | 21.00 | +5.3% | -4.8% |"
            in text)
    assert "| llama-1b | zero3 | fp16-mixed | 2048 | 8 | on | sgd | 10.00 | not measured | not measured | - | - |" \
           " error: RuntimeError: an example failure" in text
    assert "| llama-160m | 16 | 19.80 | fits | ran | yes |" in text
    assert "| llama-160m | 32 | 19.80 | does not fit | OOM | yes |" in text
    assert "| llama-1b | - | - | no boundary within micro-batch 1..128 | - | - |" in text
    assert "| causal-lm | fsdp | cuda | yes (21 tensors) |" in text
    assert "| minimal | deepspeed | cuda | NO: merge Error: an example failure |" in text
    assert "| cuda | 42.1 ms | 48650 | 32.5% | 1.2% |" in text
    assert "collectives: backend nccl, all-reduce ok: True, flight-recorder env: True, NCCL 2.27.3" in text
    assert "scaling: 1 GPU: the scaling sweep and --comm need two or more" in text


def test_a_cpu_result_claims_no_gpu_figure() -> None:
    recorded = json.loads(RECORDED.read_text())
    cpu = {**recorded, "mode": "cpu-plumbing", "gpu_figures": False, "provenance": None,
           "device": {"kind": "cpu", "name": "x86_64", "gpus": 0, "memory_bytes": None}}
    row = {**recorded["sections"]["plan"][0], "allocated_bytes": None, "reserved_bytes": None,
           "error_allocated_pct": None, "error_reserved_pct": None, "measured_on": None}
    cpu["sections"] = {"plan": [row], "bench": [{**recorded["sections"]["bench"][0], "mfu": None}]}
    text = harness().format_result(cpu)
    assert text.splitlines()[0].endswith("mode cpu-plumbing: no GPU figure was measured")
    assert "| 20.00 | not measured | not measured | - | - |" in text
    assert "| not measured |" in text.split("bench")[1]  # MFU


def test_format_command_prints_a_result_file(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--format", str(RECORDED)],
                          capture_output=True, text=True, check=True)
    assert "provenance: recorded-format" in done.stdout and "| llama-1b | single |" in done.stdout


def test_no_gpu_without_cpu_plumbing_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_truth.py"), "--out",
                           str(tmp_path / "r.json")], capture_output=True, text=True)
    assert done.returncode == 2 and "no CUDA GPU here" in done.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_section_that_failed_as_a_whole_is_one_error_line() -> None:
    result = {"date": "2026-11-24", "mode": "gpu", "gpu_figures": True,
              "device": {"kind": "cuda", "name": "NVIDIA H100", "gpus": 1},
              "sections": {"plan": [{"error": "ImportError: no deepspeed"}], "nccl": [{"error": "exit 1"}]}}
    text = harness().format_result(result)
    assert "plan: error: ImportError: no deepspeed" in text
    assert "collectives: backend None, all-reduce ok: None" in text and "error: exit 1" in text
