"""Command-line values -> the checked sweep: defaults, and every refusal made before anything starts (the
subprocess contract of these errors is in tests/faults/test_bench_faults.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from accelkit.bench.cli_spec import build_spec
from accelkit.bench.layouts import batch_replicas
from accelkit.bench.spec import check_counts
from accelkit.configs.options import ConfigOptions
from accelkit.errors import AccelkitError


def spec(**overrides):
    values = dict(options=ConfigOptions(), config_file=None, num_processes="1,2", compare_backends=None, cpu=True,
                  module=False, steps=5, warmup=1, scaling="weak", batch_arg=None, global_batch=None,
                  output=Path("out"), comm=False, comm_sizes=None, comm_iters=None, timeout=None, show_output=False,
                  rdzv_backend=None, rdzv_conf=None, same_network=None, script="train.py",
                  script_args=("--bs", "8"), command_line="accelkit bench")
    values.update(overrides)
    return build_spec(**values)[0]


def test_defaults() -> None:
    plain = spec()
    assert plain.backends == ("ddp",) and plain.world_sizes == (1, 2) and plain.comm is None
    assert spec(options=ConfigOptions(backend="fsdp")).backends == ("fsdp",)
    compare = spec(compare_backends="ddp,deepspeed", num_processes=None)
    assert compare.backends == ("ddp", "deepspeed") and len(compare.world_sizes) == 1  # the largest only
    comm = spec(comm=True).comm
    assert comm.sizes[0] == 4096 and comm.sizes[-1] == 16 * 2**20 and comm.iters == 5 and comm.warmup == 1
    assert spec(comm=True, cpu=False, comm_sizes="1K:4K", comm_iters=8).comm.sizes == (1024, 4096)
    strong = spec(scaling="strong", batch_arg="--bs")
    assert strong.global_batch == 8 and [r.script_args for r in strong.runs()] == [("--bs", "8"), ("--bs", "4")]


@pytest.mark.parametrize(("overrides", "match"), [
    ({"num_processes": "1,two"}, r"--num-processes takes whole numbers"),
    ({"num_processes": "0"}, r"--num-processes takes whole numbers"),
    ({"scaling": "strong"}, r"--scaling strong needs the script's batch-size flag"),
    ({"scaling": "strong", "batch_arg": "--lr"}, r"no global batch"),
    ({"scaling": "strong", "batch_arg": "--bs", "global_batch": 3}, r"global batch 3 does not split evenly over 2"),
    ({"compare_backends": "ddp,horovod"}, r"unknown backend horovod"),
    ({"compare_backends": "ddp", "options": ConfigOptions(backend="fsdp")}, r"--backend and --compare-backends"),
    ({"comm": True, "comm_sizes": "big"}, r"--comm-sizes big"),
    ({"comm": True, "comm_sizes": "16M:4K"}, r"--comm-sizes 16M:4K"),
    ({"num_processes": "3", "options": ConfigOptions(num_machines=2)}, r"cannot be spread evenly over 2 machines"),
])
def test_refusals(overrides: dict, match: str) -> None:
    with pytest.raises(AccelkitError, match=match) as error:
        spec(**overrides)
    assert error.value.hint


def test_step_counts() -> None:
    check_counts(1, 0)
    with pytest.raises(AccelkitError, match="--steps must be at least 1"):
        check_counts(0, 1)
    with pytest.raises(AccelkitError, match="--warmup cannot be negative"):
        check_counts(3, -1)


# -- --layouts (issue 22, item 5) ---------------------------------------------------------------------------------
def test_layouts_run_at_their_world_size_with_the_backend_that_composes_them() -> None:
    layouts = spec(layouts=("dp_shard=4;dp_shard=2,tp=2", "dp-replicate=2,dp_shard_size=2", "tp=4"),
                   num_processes=None)
    assert layouts.world_sizes == (4,)
    runs = layouts.runs()
    assert [(r.layout.name, r.backend, r.num_processes) for r in runs] == [
        ("dp_shard=4", "fsdp", 4), ("dp_shard=2,tp=2", "fsdp", 4), ("dp_replicate=2,dp_shard=2", "fsdp", 4),
        ("tp=4", "ddp", 4)]
    assert [batch_replicas(r.layout) for r in runs] == [1, 2, 1, 4]
    assert runs[1].layout.option_values() == {"dp_shard_size": 2, "tp_size": 2}
    assert len({r.name for r in runs}) == 4  # a folder each
    assert spec(layouts=("sp=2",), num_processes=None).runs()[0].backend == "deepspeed"
    assert spec(layouts=("cp=2",), num_processes=None).runs()[0].backend == "fsdp"
    # --backend names the backend of every layout (the rule set then judges each)
    assert {r.backend for r in spec(layouts=("tp=2;dp_shard=2",), num_processes="2",
                                    options=ConfigOptions(backend="fsdp")).runs()} == {"fsdp"}


def test_a_pipelines_schedule_and_microbatches_go_to_its_pp_layouts_only() -> None:
    """pp composes with FSDP2 (dp_shard) and TP as in the template; the rule set refuses --microbatches on a layout
    without a pipeline, so only the pp layouts' launches carry it."""
    from accelkit.bench.launching import launch_settings, script_request

    options = ConfigOptions(pp_schedule="1f1b", microbatches=4)
    runs = spec(layouts=("dp_shard=4;dp_shard=2,pp=2;pp=2,tp=2",), num_processes=None, options=options).runs()
    assert [(r.layout.name, r.backend) for r in runs] == [("dp_shard=4", "fsdp"), ("dp_shard=2,pp=2", "fsdp"),
                                                          ("tp=2,pp=2", "ddp")]
    settings = launch_settings(options, None, cpu=True)
    asked = [script_request(settings, r.backend, 4, "train.py", (), False, r.layout).options for r in runs]
    assert [(o.pp_size, o.dp_shard_size, o.tp_size, o.pp_schedule, o.microbatches) for o in asked] == [
        (None, 4, None, None, None), (2, 2, None, "1f1b", 4), (2, None, 2, "1f1b", 4)]


def test_strong_scaling_splits_the_global_batch_over_each_layouts_data_parallel_ranks() -> None:
    strong = spec(layouts=("dp_shard=4;dp_shard=2,tp=2",), num_processes=None, scaling="strong", batch_arg="--bs",
                  global_batch=16)
    assert [r.per_device_batch for r in strong.runs()] == [4, 8]  # 4 data-parallel ranks, then 2 (tp shares)


@pytest.mark.parametrize(("overrides", "match"), [
    ({"layouts": ("tp=2",), "num_processes": "1,2"}, r"multiply to 2, not --num-processes 1,2"),
    ({"layouts": ("dp_shard=2;tp=4",)}, r"dp_shard=2 is 2 processes but tp=4 is 4"),
    ({"layouts": ("tp=2",), "comm": True}, r"--comm cannot be combined with --layouts"),
    ({"layouts": ("tp=2",), "compare_backends": "ddp"}, r"--layouts and --compare-backends"),
    ({"layouts": ("tp=2",), "options": ConfigOptions(cp_size=2)}, r"--layouts and --cp-size"),
    ({"layouts": ("pp=2",), "options": ConfigOptions(pp_size=2)}, r"--layouts and --pp-size"),
    ({"layouts": ("dp_shard=2;tp=2",), "options": ConfigOptions(microbatches=4)},
     r"--microbatches applies to a pipeline, but no layout of --layouts has pp"),
    ({"layouts": ("dp_shard=2",), "options": ConfigOptions(pp_schedule="gpipe")},
     r"--pp-schedule applies to a pipeline, but no layout"),
    ({"layouts": ("tp=3",), "num_processes": None, "options": ConfigOptions(num_machines=2)},
     r"3 processes cannot be spread evenly over 2 machines"),
    ({"layouts": ("dp_shard=2;dp_shard=1,tp=2",), "num_processes": None, "scaling": "strong", "batch_arg": "--bs",
      "global_batch": 3}, r"global batch 3 does not split evenly"),
    ({"min_time": float("nan")}, r"--min-time must be a finite number"),
])
def test_layout_refusals(overrides: dict, match: str) -> None:
    with pytest.raises(AccelkitError, match=match) as error:
        spec(**overrides)
    assert error.value.hint


def test_the_measure_longer_command_is_the_users_with_a_longer_window() -> None:
    from accelkit.bench.rerun import longer_command

    options = ("accelkit", "bench", "--cpu", "--min-time", "2", "--num-processes", "1,2", "--force")
    assert longer_command(options, ("train.py", "--min-time", "7"), 2.0) == (
        "accelkit bench --cpu --num-processes 1,2 --min-time 10 --force train.py --min-time 7")
    assert longer_command(("accelkit", "bench", "--min-time=4", "--layouts", "dp_shard=2;tp=2"), ("t.py",), 4.0) == (
        "accelkit bench --layouts 'dp_shard=2;tp=2' --min-time 20 --force t.py")


@pytest.mark.parametrize(("argv", "script", "args", "options", "script_words"), [
    (["bench", "--cpu", "t.py", "--x", "1"], "t.py", ("--x", "1"), ["bench", "--cpu"], ("t.py", "--x", "1")),
    (["bench", "t.py", "--", "--x"], "t.py", ("--x",), ["bench"], ("t.py", "--", "--x")),
    (["bench", "--cpu", "--", "t.py", "--x"], "t.py", ("--x",), ["bench", "--cpu"], ("--", "t.py", "--x")),
    (["bench", "t.py", "--"], "t.py", (), ["bench"], ("t.py", "--")),
    (["bench", "--comm"], None, (), ["bench", "--comm"], ()),
])
def test_the_command_line_splits_at_the_script(argv, script, args, options, script_words) -> None:
    from accelkit.bench.rerun import split_command_line

    assert split_command_line(argv, script, args) == (("accelkit", *options), script_words)


def test_the_measure_longer_command_raises_the_scripts_step_cap() -> None:
    """Issue 32 item 5: a re-run with a 10 s window on a script capped at --max-steps 1000 of 2 ms would end before
    its window, as the first run did: the cap is raised to what the window needs (with a margin)."""
    from accelkit.bench.rerun import longer_command

    options = ("accelkit", "bench", "--cpu", "--num-processes", "1,2")
    assert longer_command(options, ("train.py", "--max-steps", "1000"), 2.0, step_seconds=0.002, warmup=5).endswith(
        "--min-time 10 --force train.py --max-steps 7505")
    assert longer_command(options, ("train.py", "--max_steps=100000"), 2.0, step_seconds=0.002).endswith(
        "train.py --max_steps=100000")  # already enough
