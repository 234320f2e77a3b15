"""Pipeline-parallel layouts that cannot work (issue 34, item 1): `--pp-size`, `--pp-schedule` and `--microbatches`
refused in one line with the fix, exit 1, no traceback, nothing written, and no rank started on a launch."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.faults import invoke_fault

TEMPLATE = REPO_ROOT / "templates" / "causal-lm" / "train.py"

CONFIG_CASES = [
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "0"], r"--pp-size 0: a parallelism size is at least 1"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "x"], r"'x' is not a valid integer"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--pp-schedule", "zigzag"],
     r"--pp-schedule 'zigzag' is not a pipeline schedule"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-schedule", "gpipe"],
     r"--pp-schedule gpipe applies to a pipeline, but there is none \(pp_size is 1\)"),
    (["--backend", "ddp", "--num-processes", "2", "--microbatches", "8"],
     r"--microbatches 8 applies to a pipeline, but there is none"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--microbatches", "1"],
     r"--microbatches 1 is fewer than the 2 pipeline stages \(pp 2\)"),
    # issue 46: 0 became the default silently; 10^12 was accepted
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--microbatches", "0"],
     r"--microbatches 0: a pipeline splits each batch into one or more microbatches"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--microbatches", "1000000000000"],
     r"--microbatches 1000000000000 is above 4,096"),
    (["--backend", "ddp", "--num-processes", "4", "--pp-size", "4", "--pp-schedule", "interleaved1f1b",
      "--microbatches", "9"], r"9 is not a multiple of pp 4"),
    (["--backend", "deepspeed", "--num-processes", "2", "--pp-size", "2"],
     r"DeepSpeed's pipeline engine is not reachable through Accelerate"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--cp-size", "2"],
     r"--pp-size 2 with --cp-size 2: the pipeline composes with FSDP2 \(dp_shard\) and tensor parallelism"),
    (["--backend", "ddp", "--num-processes", "4", "--pp-size", "2"], r"leaves 2 replicas of the pipeline"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "3"], r"--pp-size 3 does not divide --num-processes 4"),
    (["--backend", "fsdp", "--fsdp-version", "1", "--num-processes", "4", "--pp-size", "2"], r"needs FSDP2"),
    (["--backend", "ddp", "--num-processes", "4", "--pp-size", "4", "--model-config", str(TEMPLATE)],
     r"--pp-size 4 makes 4 pipeline stages, but the model has 2 decoder layers"),
    # issue 46: options the pipeline loop would drop without a word
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--reduce-dtype", "bf16"],
     r"--reduce-dtype bf16 with a pipeline \(pp 2\): .*nothing would apply it"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--grad-compression", "powersgd"],
     r"--grad-compression powersgd with a pipeline \(pp 2\)"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--mixed-precision", "fp16"],
     r"--mixed-precision fp16 with --pp-size 2: fp16 needs a loss scaler across the stages"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--state-dict", "full"],
     r"--state-dict full with --pp-size 2: the pipeline saves each stage's shards"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--offload"],
     r"--offload with --pp-size 2: the pipeline's stages are not offloaded"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--wrap-policy", "size"],
     r"--wrap-policy size with --pp-size 2: the pipeline shards each decoder layer as one FSDP2 unit"),
]


@pytest.mark.parametrize(("args", "message"), CONFIG_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_config_refuses_and_writes_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke_fault(["config", *args, "-o", str(tmp_path / "out.yaml")], watch=[tmp_path], cwd=tmp_path)
    usage = "not a valid" in message or "not one of" in message  # click's usage errors
    result.assert_refused(message, exit_code=2 if usage else 1, hint=not usage)


@pytest.mark.parametrize(("args", "message"), [
    # The stage split against the template's own model (2 decoder layers), before any rank starts.
    (["--backend", "ddp", "--num-processes", "4", "--pp-size", "4"],
     r"--pp-size 4 makes 4 pipeline stages, but the model has 2 decoder layers"),
    (["--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "--pp-schedule", "interleaved1f1b"],
     r"makes 4 pipeline stages \(2 per process with --pp-schedule interleaved1f1b\), but the model has 2"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--microbatches", "1"],
     r"--microbatches 1 is fewer than the 2 pipeline stages"),
    (["--backend", "fsdp", "--num-processes", "4", "--pp-size", "2", "--reduce-dtype", "bf16"],
     r"--reduce-dtype bf16 with a pipeline \(pp 2\)"),
])
def test_launch_refuses_a_pipeline_before_any_rank_starts(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", *args, str(TEMPLATE), "--output-dir", str(tmp_path / "out")],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(message)


def test_a_broken_pipeline_line_in_a_config_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text("# accelkit-pipeline: pp=2,schedule=zigzag\ndistributed_type: MULTI_GPU\nnum_processes: 2\n"
                      "num_machines: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n")
    result = invoke_fault(["launch", "--cpu", "--config", str(config), str(TEMPLATE)], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(r"accelkit-pipeline\): schedule 'zigzag' is not a pipeline schedule")


@pytest.mark.parametrize("pipeline", [["--pp-size", "2"], "config"], ids=["flag", "config-comment"])
def test_a_pipeline_on_a_script_without_pipeline_code_is_refused(pipeline, tmp_path: Path) -> None:
    """Issue 46: `--pp-size 2` on a plain script trained two data-parallel replicas under a banner saying pp 2. The
    layout reaches the ranks only as $ACCELKIT_PIPELINE, so a script that never reads it (nor a module beside it) is
    refused before any rank starts; the template, whose pipeline_parallel.py reads it, is not."""
    project = tmp_path / "project"
    project.mkdir()
    script = project / "train.py"
    script.write_text("import torch\nfrom accelerate import Accelerator\nprint(Accelerator().num_processes)\n")
    (project / "helpers.py").write_text("BATCH = 8\n")
    args = ["--backend", "ddp", "--num-processes", "2", *pipeline] if pipeline != "config" else []
    if pipeline == "config":
        config = tmp_path / "pp.yaml"
        written = invoke_fault(["config", "--backend", "ddp", "--num-processes", "2", "--pp-size", "2", "-o",
                                str(config)], watch=[tmp_path / "none"], cwd=tmp_path)
        assert written.returncode == 0, written.stderr
        args = ["--config", str(config)]
    result = invoke_fault(["launch", "--cpu", *args, "train.py"], watch=[tmp_path], cwd=project)
    said = "--pp-size 2" if pipeline != "config" else "pp_size 2"
    result.assert_refused(rf"{said}.*: train.py has no pipeline code \(neither it nor a module beside it reads "
                          r"\$ACCELKIT_PIPELINE\), so every rank would train the whole model as a data-parallel "
                          "replica")
    assert f"or launch without {said}" in result.stderr  # the hint names the way out
