"""`accelkit plan --grad-compression/--interconnect` (issue 35): the communication column counts the compression
on the rows it applies to, and the recommendation names compression when the link, not memory, is the limit."""

from __future__ import annotations

import json

import pytest
from helpers import invoke_accelkit

from accelkit.compression.plan_comm import parse_interconnect
from accelkit.errors import AccelkitError

BASE = ("plan", "--params", "1B", "--num-processes", "16", "--num-machines", "2", "--gpu-memory", "80GB",
        "--cpu-memory", "1TB", "--json")


def _plan(*extra: str) -> dict:
    result = invoke_accelkit(*BASE, *extra)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _comm(plan: dict) -> dict[str, int]:
    return {row["name"]: row["comm_bytes_per_step"] for row in plan["strategies"]}


def test_int8_quarters_zero3_only_and_a_16_bit_hook_halves_ddp() -> None:
    plain, int8 = _comm(_plan()), _comm(_plan("--grad-compression", "int8"))
    assert int8["zero3"] == pytest.approx(plain["zero3"] / 4, rel=1e-6)
    assert int8["ddp"] == plain["ddp"] and int8["fsdp-full"] == plain["fsdp-full"] and int8["zero2"] == plain["zero2"]
    bf16 = _comm(_plan("--grad-compression", "bf16"))
    assert bf16["ddp"] == pytest.approx(plain["ddp"] / 2, rel=1e-6)  # DDP's gradients are fp32 under mixed precision
    assert bf16["fsdp-full"] == plain["fsdp-full"]  # FSDP already reduces in bf16 under bf16 mixed precision


def test_slow_links_make_the_recommendation_name_compression() -> None:
    plan = _plan("--interconnect", "ethernet")
    verdict = plan["grad_compression"]
    assert verdict["interconnect_limited"] is True and verdict["suggested"]
    assert "the interconnect, not memory, is the limit" in plan["recommendation"]["reason"].lower()
    fast = _plan("--params", "1B", "--strategy", "ddp", "--interconnect", "nvlink", "--grad-compression", "powersgd",
                 "--global-batch", "256", "--seq-len", "4096")
    assert fast["grad_compression"]["interconnect_limited"] is False
    assert "Compression pays little here" in fast["recommendation"]["reason"]


@pytest.mark.parametrize(("text", "expected"), [("nvlink", 400e9), ("100Gb/s", 12.5e9), ("25GB/s", 25e9)])
def test_interconnects_parse(text: str, expected: float) -> None:
    assert parse_interconnect(text)[0] == pytest.approx(expected)


def test_a_bad_interconnect_is_refused() -> None:
    with pytest.raises(AccelkitError, match="is not a link or a bandwidth"):
        parse_interconnect("2TB/s")


def test_the_bandwidth_of_a_bench_comm_run_is_read(tmp_path) -> None:
    """`--interconnect DIR`: the all-reduce busbw `accelkit bench --comm` wrote (its CommRow records), at the
    largest world size and message size."""
    from accelkit.bench.comm import CommRow

    def row(size: int, busbw: float, op: str = "all_reduce") -> dict:
        return CommRow(op=op, num_processes=2, size_bytes=size, count=size // 4, dtype="float32", time_us=1.0,
                       algbw_gbs=busbw, busbw_gbs=busbw).to_json()

    (tmp_path / "bench.json").write_text(json.dumps({"comm": [{"num_processes": 2, "status": "ok", "results": [
        row(1024, 0.1), row(1 << 24, 0.43), row(1 << 24, 9.0, "all_gather")]}]}))
    bandwidth, label = parse_interconnect(str(tmp_path))
    assert bandwidth == pytest.approx(0.43e9) and "measured by bench --comm" in label
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "bench.json").write_text(json.dumps({"comm": []}))
    with pytest.raises(AccelkitError, match="holds no all-reduce measurement"):
        parse_interconnect(str(tmp_path / "empty"))


WRITE = ("plan", "--params", "1B", "--num-processes", "8", "--gpu-memory", "80GB")


def test_write_config_carries_powersgd_to_the_line_launch_reads(tmp_path) -> None:
    """`plan --write-config` writes the compression where `accelkit launch` reads it (the config's comment line),
    with PowerSGD's rank and start step, and the printed `accelkit config` command says the same."""
    from accelkit.compression.compression_spec import CompressionSpec, read_compression_comment

    out = tmp_path / "plan.yaml"
    result = invoke_accelkit(*WRITE, "--strategy", "ddp", "--grad-compression", "powersgd", "--powersgd-rank", "4",
                             "--powersgd-start-step", "0", "--write-config", str(out))
    assert result.returncode == 0, result.stderr
    assert read_compression_comment(out.read_text(), str(out)) == CompressionSpec("powersgd", 4, 0)
    assert "--grad-compression powersgd --powersgd-rank 4 --powersgd-start-step 0" in result.stdout
    fsdp = tmp_path / "fsdp.yaml"
    assert invoke_accelkit(*WRITE, "--strategy", "fsdp-full", "--grad-compression", "bf16", "--write-config",
                           str(fsdp)).returncode == 0
    assert read_compression_comment(fsdp.read_text(), str(fsdp)) == CompressionSpec("bf16")  # FSDP2's reduce dtype
    plain = tmp_path / "plain.yaml"
    assert invoke_accelkit(*WRITE, "--strategy", "ddp", "--write-config", str(plain)).returncode == 0
    assert read_compression_comment(plain.read_text(), str(plain)) is None


def test_write_config_int8_writes_zeropp_json_deepspeed_accepts(tmp_path) -> None:
    """ZeRO-3 + int8: the YAML references a DeepSpeed JSON beside it with the ZeRO++ keys, and DeepSpeed's own
    config class reads them back (validated on CPU: ZeRO++'s kernels need CUDA to run)."""
    from deepspeed.runtime.config import DeepSpeedConfig

    out = tmp_path / "plan.yaml"
    result = invoke_accelkit(*WRITE, "--strategy", "zero3", "--grad-compression", "int8", "--write-config", str(out))
    assert result.returncode == 0, result.stderr
    ds = tmp_path / "plan.json"
    assert f"Wrote {out} and {ds}" in result.stdout + result.stderr
    assert str(ds) in out.read_text()  # deepspeed_config_file
    content = json.loads(ds.read_text())
    zero = content["zero_optimization"]
    assert zero["stage"] == 3 and zero["zero_quantized_weights"] and zero["zero_quantized_gradients"]
    filled = {k: v for k, v in content.items() if v != "auto"}
    filled.update(train_batch_size=1, train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1)
    parsed = DeepSpeedConfig(filled).zero_config
    assert parsed.zero_quantized_weights and parsed.zero_quantized_gradients
    assert parsed.zero_hpz_partition_size == 1  # one machine: no slower link for hpZ to avoid
