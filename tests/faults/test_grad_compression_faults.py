"""Every gradient-compression combination that cannot work is refused in one line, with nothing written: config,
launch (CPU rehearsal) and bench alike (issue 35)."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import REPO_ROOT
from helpers.faults import invoke_fault

SCRIPT = REPO_ROOT / "templates" / "minimal" / "train.py"

CONFIG_CASES = [
    (["--backend", "fsdp", "--num-processes", "2", "--grad-compression", "powersgd"],
     r"--grad-compression powersgd is not an FSDP option"),
    (["--backend", "fsdp", "--num-processes", "2", "--grad-compression", "int8"],
     r"--grad-compression int8 is not an FSDP option"),
    (["--backend", "fsdp", "--fsdp-version", "1", "--num-processes", "2", "--reduce-dtype", "bf16"],
     r"FSDP2's MixedPrecisionPolicy, but the config is FSDP version 1"),
    (["--backend", "deepspeed", "--zero-stage", "1", "--num-processes", "2", "--grad-compression", "int8",
      "--deepspeed-json", "ds.json"], r"ZeRO\+\+.*the config is ZeRO stage 1"),
    (["--backend", "deepspeed", "--zero-stage", "2", "--num-processes", "2", "--grad-compression", "int8",
      "--deepspeed-json", "ds.json"], r"ZeRO\+\+.*the config is ZeRO stage 2"),
    (["--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "2", "--grad-compression", "powersgd",
      "--deepspeed-json", "ds.json"], r"--grad-compression powersgd is not a DeepSpeed option"),
    (["--backend", "ddp", "--num-processes", "1", "--grad-compression", "fp16"],
     r"--grad-compression fp16 on one process: there is no gradient communication"),
    (["--backend", "single", "--grad-compression", "bf16"],
     r"--grad-compression bf16 on one process"),
    (["--backend", "ddp", "--num-processes", "2", "--grad-compression", "int8"],
     r"DDP has no maintained int8 gradient path"),
    (["--backend", "ddp", "--num-processes", "2", "--reduce-dtype", "bf16"],
     r"--reduce-dtype is an FSDP option, but the backend is ddp"),
    (["--backend", "fsdp", "--num-processes", "2", "--reduce-dtype", "bf16", "--grad-compression", "fp16"],
     r"--reduce-dtype bf16 contradicts --grad-compression fp16"),
    (["--backend", "ddp", "--num-processes", "2", "--powersgd-rank", "4"],
     r"--powersgd-rank applies only to --grad-compression powersgd"),
    (["--backend", "ddp", "--num-processes", "2", "--grad-compression", "powersgd", "--powersgd-rank", "0"],
     r"--powersgd-rank must be at least 1"),
    # issue 46: ceilings (rank 10^11 and start step 10^20 were accepted)
    (["--backend", "ddp", "--num-processes", "2", "--grad-compression", "powersgd", "--powersgd-rank",
      "100000000000"], r"--powersgd-rank 100000000000 is above 1024"),
    (["--backend", "ddp", "--num-processes", "2", "--grad-compression", "powersgd", "--powersgd-start-step",
      "100000000000000000000"], r"--powersgd-start-step 100000000000000000000 is above 1,000,000,000 optimizer steps"),
    (["--backend", "ddp", "--num-processes", "2", "--grad-compression", "powersgd", "--powersgd-start-step", "-1"],
     r"--powersgd-start-step must be 0 or more"),
]


@pytest.mark.parametrize(("args", "message"), CONFIG_CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_config_refuses_and_writes_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke_fault(["config", *args, "-o", str(tmp_path / "out.yaml")], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(message)


def test_config_int8_printed_to_stdout_has_nowhere_to_write_its_json(tmp_path: Path) -> None:
    result = invoke_fault(["config", "--backend", "deepspeed", "--zero-stage", "3", "--num-processes", "2",
                           "--grad-compression", "int8"], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"the ZeRO\+\+ keys live in a DeepSpeed JSON")
    assert "-o FILE" in result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--backend", "ddp", "--grad-compression", "bf16"], r"bf16 on CPU ranks: torch's bf16_compress_hook refuses gloo"),
    (["--backend", "deepspeed", "--zero-stage", "3", "--grad-compression", "int8", "--deepspeed-json", "ds.json"],
     r"int8 on CPU ranks: ZeRO\+\+'s quantization kernels need CUDA"),
    (["--backend", "fsdp", "--grad-compression", "powersgd"], r"--grad-compression powersgd is not an FSDP option"),
])
def test_cpu_rehearsal_refuses_before_any_rank(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", *args, str(SCRIPT)], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(message)


def test_bench_refuses_a_bad_combination_before_any_run(tmp_path: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "--backend", "fsdp", "--num-processes", "2", "--grad-compression",
                           "powersgd", "-o", str(tmp_path / "results"), str(SCRIPT)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"--grad-compression powersgd is not an FSDP option")


def test_bench_refuses_options_of_another_bench(tmp_path: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "--comm", "--backend", "ddp", "--grad-compression", "fp16",
                           "-o", str(tmp_path / "results"), str(SCRIPT)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"--grad-compression and --comm are separate benches")


@pytest.mark.parametrize(("args", "message"), [
    (["--layouts", "dp_shard=2", "--grad-compression", "powersgd"],
     r"--grad-compression powersgd is not an FSDP option"),  # applies to no layout: nothing to compare
    (["--layouts", "dp_replicate=2;dp_shard=2", "--compare-backends", "ddp,fsdp", "--grad-compression", "fp16"],
     r"--layouts and --compare-backends both choose what each run launches"),
    (["--layouts", "dp_replicate=2", "--tp-size", "2", "--grad-compression", "fp16"],
     r"--layouts and --tp-size both set the parallelism sizes"),
    (["--layouts", "dp_replicate=2;dp_shard=2", "--num-processes", "4", "--grad-compression", "fp16"],
     r"--layouts: the sizes of dp_replicate=2 multiply to 2, not --num-processes 4"),
    (["--layouts", "dp_shard=2;pp=2", "--grad-compression", "fp16"],
     r"--grad-compression with --layouts pp=2: a pipeline's stages are not prepared by Accelerate"),
    (["--layouts", "dp_replicate=2;dp_shard=4", "--grad-compression", "fp16"],
     r"layouts are compared at one world size"),
    (["--layouts", "tp=2", "--backend", "fsdp", "--fsdp-version", "1", "--grad-compression", "fp16"],
     r"layout tp=2 \(fsdp\): "),  # the uncompressed run of a layout cannot start: refused, not a row
])
def test_bench_layouts_with_compression_refuses_before_any_run(args: list[str], message: str,
                                                                tmp_path: Path) -> None:
    result = invoke_fault(["bench", "--cpu", *args, "-o", str(tmp_path / "results"), str(SCRIPT)], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(message)


def test_bench_refuses_one_process(tmp_path: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "1", "--grad-compression", "fp16",
                           "-o", str(tmp_path / "results"), str(SCRIPT)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"compares at one world size of 2 or more")


def test_a_broken_comment_line_in_a_config_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "ddp.yaml"
    config.write_text("# accelkit-grad-compression: zstd\ndistributed_type: MULTI_GPU\nnum_processes: 2\n"
                      "num_machines: 1\nmachine_rank: 0\nmixed_precision: 'no'\nuse_cpu: false\n")
    result = invoke_fault(["launch", "--cpu", "--config", str(config), str(SCRIPT)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"unknown gradient compression 'zstd'")


@pytest.mark.parametrize(("args", "message"), [
    (["--interconnect", "2TB/s"], r"--interconnect '2TB/s' is not a link or a bandwidth"),
    (["--powersgd-rank", "4"], r"--powersgd-rank applies only to --grad-compression powersgd"),
    (["--powersgd-start-step", "0"], r"--powersgd-start-step applies only to --grad-compression powersgd"),
    (["--grad-compression", "powersgd", "--strategy", "fsdp-full"],
     r"--write-config: --grad-compression powersgd does not apply to the recommended FSDP full shard"),
    (["--grad-compression", "int8", "--strategy", "zero2"],
     r"--write-config: --grad-compression int8 does not apply to the recommended ZeRO-2"),
    (["--grad-compression", "int8", "--strategy", "ddp"],
     r"--write-config: --grad-compression int8 does not apply to the recommended DDP"),
])
def test_plan_refuses_before_planning_and_writes_nothing(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke_fault(["plan", "--params", "1B", "--num-processes", "8", "--gpu-memory", "80GB", *args,
                           "--write-config", str(tmp_path / "plan.yaml")], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(message)


def test_plan_int8_refuses_to_replace_an_existing_deepspeed_json(tmp_path: Path) -> None:
    """The ZeRO++ JSON plan writes beside FILE is refused like FILE itself when it exists (no --force)."""
    (tmp_path / "plan.json").write_text("{}\n")
    result = invoke_fault(["plan", "--params", "1B", "--num-processes", "8", "--gpu-memory", "80GB", "--strategy",
                           "zero3", "--grad-compression", "int8", "--write-config", str(tmp_path / "plan.yaml")],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"plan\.json already exists")
