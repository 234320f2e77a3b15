"""The sweep's plan: world sizes, backends, strong scaling's per-device batch, and the checks made before any run."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.bench.spec import (
    BenchSpec,
    check_output,
    default_world_sizes,
    flag_value,
    parse_backends,
    parse_int_list,
    resolve_global_batch,
    set_flag,
)
from accelkit.errors import AccelkitError


def test_default_world_sizes() -> None:
    assert default_world_sizes(1) == (1,)
    assert default_world_sizes(2) == (1, 2)
    assert default_world_sizes(8) == (1, 2, 4, 8)
    assert default_world_sizes(6) == (1, 2, 4, 6)


def test_lists() -> None:
    assert parse_int_list("8,1, 2,2", "--num-processes") == (1, 2, 8)
    for bad in ("1,x", "0", "", "1,,2", "-2"):
        with pytest.raises(AccelkitError, match="--num-processes"):
            parse_int_list(bad, "--num-processes")
    assert parse_backends("ddp, fsdp,deepspeed,ddp") == ("ddp", "fsdp", "deepspeed")
    with pytest.raises(AccelkitError, match="unknown backend megatron"):
        parse_backends("ddp,megatron")


def test_flags_in_script_arguments() -> None:
    args = ("--lr", "1", "--batch", "64", "--x=2")
    assert flag_value(args, "--batch") == "64" and flag_value(args, "--x") == "2" and flag_value(args, "--y") is None
    assert set_flag(args, "--batch", "16") == ("--lr", "1", "--batch", "16", "--x=2")
    assert set_flag(args, "--x", "5") == ("--lr", "1", "--batch", "64", "--x=5")
    assert set_flag(("--lr", "1"), "--batch", "8") == ("--lr", "1", "--batch", "8")
    assert set_flag(("--batch",), "--batch", "8") == ("--batch", "--batch", "8")  # a dangling flag is left alone


def test_strong_scaling_tells_each_run_global_over_n() -> None:
    args = ("--per-device-batch-size", "64", "--lr", "3e-4")
    batch = resolve_global_batch(args, "--per-device-batch-size", None, (1, 2, 4))
    spec = BenchSpec(script="train.py", script_args=args, module=False, world_sizes=(1, 2, 4), backends=("ddp",),
                     steps=3, warmup=1, scaling="strong", batch_arg="--per-device-batch-size", global_batch=batch)
    runs = spec.runs()
    assert [(r.num_processes, r.per_device_batch) for r in runs] == [(1, 64), (2, 32), (4, 16)]
    assert runs[2].script_args == ("--per-device-batch-size", "16", "--lr", "3e-4")
    weak = BenchSpec(script="train.py", script_args=args, module=False, world_sizes=(1, 2), backends=("ddp", "fsdp"),
                     steps=3, warmup=1)
    assert [(r.backend, r.num_processes, r.script_args) for r in weak.runs()] == [
        ("ddp", 1, args), ("ddp", 2, args), ("fsdp", 1, args), ("fsdp", 2, args)]


@pytest.mark.parametrize(("args", "batch_arg", "global_batch", "match"), [
    ((), None, 64, "needs the script's batch-size flag"),
    ((), "--bs", None, "no global batch"),
    (("--bs", "many"), "--bs", None, "is not a batch size"),
    ((), "--bs", 6, "does not split evenly over 4"),
])
def test_strong_scaling_refusals(args, batch_arg, global_batch, match) -> None:
    with pytest.raises(AccelkitError, match=match):
        resolve_global_batch(args, batch_arg, global_batch, (1, 2, 4))


def test_output_folder_checks(tmp_path: Path) -> None:
    check_output(tmp_path / "new", force=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(AccelkitError, match="a file is in the way"):
        check_output(tmp_path / "file", force=False)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "bench.json").write_text("{}")
    with pytest.raises(AccelkitError, match="already holds results"):
        check_output(tmp_path / "old", force=False)
    check_output(tmp_path / "old", force=True)
