"""`accelkit bench` failure paths: bad options refused before anything starts (nothing written), and runs that
crash, lose a rank or are interrupted: reported in the table and bench.json, the sweep going on or stopping as a
user would expect, no process left behind."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from helpers import DATA, REPO_ROOT
from helpers.faults import invoke_fault, run_fault

COUNTED = DATA / "bench" / "counted_train.py"
TEMPLATE = REPO_ROOT / "templates" / "causal-lm" / "train.py"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text("print('never run')\n")
    return path


@pytest.mark.parametrize(("args", "match"), [
    (["--num-processes", "1,two"], r"--num-processes takes whole numbers"),
    (["--scaling", "strong", "--batch-arg", "--bs", "--global-batch", "3", "--num-processes", "1,2"],
     r"global batch 3 does not split evenly over 2"),
    (["--compare-backends", "ddp,fsdp", "--backend", "ddp"], r"--backend and --compare-backends"),
])  # every other option check: tests/unit/bench/test_bench_cli_spec.py (same path, in-process)
def test_bad_options_are_refused_before_anything_starts(args: list[str], match: str, tmp_path: Path,
                                                        script: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "--num-processes", "1", "-o", str(tmp_path / "out"), *args,
                           str(script)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


@pytest.mark.parametrize(("layouts", "extra", "match"), [
    ("tp2", [], r"--layouts: 'tp2' is not DIM=SIZE"),
    ("ep=2", [], r"--layouts: unknown dimension 'ep' in 'ep=2'"),
    ("dp_shard=2,pp=2;pp=2", [], r"--layouts: dp_shard=2,pp=2 is 4 processes but pp=2 is 2"),
    ("pp=2", ["--num-processes", "4"], r"multiply to 2, not --num-processes 4"),
    ("pp=2", ["--pp-size", "2"], r"--layouts and --pp-size both set the parallelism sizes"),
    ("dp_shard=2;tp=2", ["--microbatches", "4"], r"--microbatches applies to a pipeline, but no layout of --layouts"),
    ("dp_shard=4;dp_shard=2", [], r"--layouts: dp_shard=4 is 4 processes but dp_shard=2 is 2"),
    ("tp=1", [], r"--layouts: tp=1 is one process"),
    ("dp_shard=4;dp_shard=2,tp=2", ["--num-processes", "2"], r"multiply to 4, not --num-processes 2"),
    ("tp=2", ["--tp-size", "2"], r"--layouts and --tp-size both set the parallelism sizes"),
])  # every other --layouts check: tests/unit/bench/test_bench_cli_spec.py and test_bench_layouts.py (in-process)
def test_bad_layouts_are_refused_before_anything_starts(layouts: str, extra: list[str], match: str,
                                                        tmp_path: Path, script: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), "--layouts", layouts, *extra,
                           str(script)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


@pytest.mark.parametrize("value", ["-1", "nan"])
def test_a_min_time_that_is_not_seconds_is_refused(value: str, tmp_path: Path, script: Path) -> None:
    result = invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), "--min-time", value, str(script)],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused("--min-time", exit_code=2, hint=False)


@pytest.mark.slow  # the rule set builds each layout's config with Accelerate (a few seconds of imports)
@pytest.mark.parametrize(("layouts", "match"), [
    ("dp_shard=2;cp=2", r"--layouts cp=2 \(fsdp\): .*context parallelism does not run on CPU"),
    # FSDP2 x TP is no longer refused on the default install (accelkit.ranks.fsdp2_tp_compat); the refusal for
    # releases with neither the class nor the TP-plan function: tests/unit/configs/test_nd_config.py
    ("tp=2", r"--layouts tp=2 \(fsdp\): .*leaves FSDP nothing to shard"),
])
def test_a_layout_the_rule_set_refuses_is_named_before_any_starts(layouts: str, match: str, tmp_path: Path,
                                                                  script: Path) -> None:
    backend = ["--backend", "fsdp"] if layouts == "tp=2" else []
    result = run_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), *backend, "--layouts", layouts, str(script)],
                       watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


@pytest.mark.slow  # the rule set builds each layout's config with Accelerate (a few seconds of imports)
@pytest.mark.parametrize(("layouts", "extra", "match"), [
    # the causal-lm template's model has 2 decoder layers: 4 stages cannot hold whole layers
    ("dp_shard=4;pp=4", [], r"--layouts pp=4 \(ddp\): --pp-size 4 makes 4 pipeline stages, but the model has 2 "
                            r"decoder layers"),
    ("dp_shard=2;pp=2", ["--microbatches", "1"], r"--layouts pp=2 \(ddp\): --microbatches 1 is fewer than the 2 "
                                                 r"pipeline stages"),
    ("dp_shard=4;cp=2,pp=2", [], r"--layouts cp=2,pp=2 \(fsdp\): --pp-size 2 with --cp-size 2: the pipeline "
                                 r"composes with FSDP2 \(dp_shard\) and tensor parallelism"),
])
def test_a_pipeline_layout_the_rule_set_refuses_is_named_before_any_starts(layouts: str, extra: list[str],
                                                                           match: str, tmp_path: Path) -> None:
    result = run_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), "--layouts", layouts, *extra, str(TEMPLATE),
                        "--output-dir", str(tmp_path / "train-out")], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)


def test_no_script(tmp_path: Path) -> None:
    invoke_fault(["bench", "--cpu"], watch=[tmp_path], cwd=tmp_path).assert_refused("no SCRIPT to bench")


def test_a_missing_script(tmp_path: Path) -> None:
    invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), str(tmp_path / "nope.py")], watch=[tmp_path],
                 cwd=tmp_path).assert_refused(r"script not found: .*nope\.py")


@pytest.mark.slow  # builds the configs with Accelerate (a few seconds of imports)
def test_an_impossible_config_is_refused_by_launchs_own_checks(tmp_path: Path, script: Path) -> None:
    run_fault(["bench", "--cpu", "--backend", "ddp", "--zero-stage", "2", "--num-processes", "2", "-o",
               str(tmp_path / "out"), str(script)], watch=[tmp_path], cwd=tmp_path).assert_refused(r"zero-stage")


def test_earlier_results_are_kept_unless_forced(tmp_path: Path, script: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "bench.json").write_text('{"runs": []}')
    invoke_fault(["bench", "--cpu", "-o", str(out), str(script)], watch=[tmp_path],
                 cwd=tmp_path).assert_refused("already holds results")
    (tmp_path / "file").write_text("x")
    invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "file"), str(script)], watch=[tmp_path],
                 cwd=tmp_path).assert_refused("a file is in the way")


# -- real runs that fail -----------------------------------------------------------------------------------------
def results(out: Path) -> list[dict]:
    return json.loads((out / "bench.json").read_text())["runs"]


@pytest.mark.slow
def test_a_script_that_fails_at_once_stops_the_sweep(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "1,2", "--warmup", "0", "--steps",
                        "2", "-o", str(out), str(COUNTED), "--crash-at-world-size", "1"], watch=[tmp_path],
                       cwd=tmp_path, kind="script crash", expect="refused")
    line = result.assert_refused(r"1 of 1 run\(s\) failed, first ddp x1: rank 0: RuntimeError: deliberate failure",
                                 owned=[out])
    assert "sweep stopped" in line
    (run,) = results(out)  # the 2-process run was not started: the same error would repeat
    assert run["status"] == "failed" and run["exit_code"] == 1 and run["speedup"] is None
    assert "RuntimeError: deliberate failure" in (out / "runs" / "ddp-np1" / "output.log").read_text()
    assert "FAILED" in result.stdout
    # The end of the script's output, where its error is, is shown under the progress line.
    assert [line for line in result.stderr.splitlines() if line.startswith("bench:   | ") and "deliberate" in line]


@pytest.mark.slow
def test_a_killed_rank_is_reported_and_nothing_is_orphaned(tmp_path: Path) -> None:
    # (Whether the sweep goes on after such a failure: tests/unit/bench/test_bench_sweep.py.)
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "2", "--warmup", "1", "--steps",
                        "3", "-o", str(out), str(COUNTED), "--kill-rank", "1"], watch=[tmp_path], cwd=tmp_path,
                       kind="rank killed", expect="refused")
    # The cause is the killed rank, not the survivor's "connection reset by peer".
    result.assert_refused(r"1 of 1 run\(s\) failed, first ddp x2: a rank was killed by SIGKILL", owned=[out])
    (run,) = results(out)
    assert run["status"] == "failed" and run["exit_code"] == 128 + signal.SIGKILL and run["samples_per_s"] is None
    assert "ddp  2 process(es): FAILED: a rank was killed by SIGKILL" in result.stdout
    assert (out / "bench.csv").read_text().count("\n") == 2


@pytest.mark.slow
def test_ctrl_c_stops_the_run_and_the_sweep_and_keeps_what_was_measured(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "2", "--warmup", "1", "--steps",
                        "100000", "--show-output", "-o", str(out), str(COUNTED), "--slow-data", "0.05"],
                       watch=[tmp_path], cwd=tmp_path, send_signal=("RANK 1 TRAINING", signal.SIGINT),
                       kind="signal", expect="signal")
    assert result.returncode == 130, result.stderr[-3000:]
    assert not result.orphans
    # --show-output shows the ranks' own KeyboardInterrupt tracebacks ("[rankN]: ..."); accelkit prints none.
    assert not [line for line in result.stderr.splitlines() if "Traceback" in line and not line.startswith("[rank")]
    assert not result.touched_outside([out])
    (run,) = results(out)
    assert run["status"] == "interrupted"
    assert "interrupted (signal SIGINT)" in result.stderr


@pytest.mark.slow
def test_a_run_over_its_timeout_is_stopped_and_recorded(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "1", "--timeout", "4", "-o", str(out),
                        str(COUNTED), "--slow-data", "30"], watch=[tmp_path], cwd=tmp_path, kind="hang",
                       expect="refused", timeout=120)
    result.assert_refused(r"1 of 1 run\(s\) failed, first ddp x1: timed out", owned=[out])
    (run,) = results(out)
    assert run["status"] == "timed out" and run["wall_time_s"] < 60


# -- issue 19: the first failing rank, stalls, the script's own messages -------------------------------------------
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_a_stall_timeout_that_is_not_a_finite_number_of_seconds_is_refused(value: str, tmp_path: Path,
                                                                           script: Path) -> None:
    # nan was accepted once, and the watchdog then fired after a second; inf would never fire
    result = invoke_fault(["bench", "--cpu", "--stall-timeout", value, "-o", str(tmp_path / "out"),
                           str(script)], watch=[tmp_path], cwd=tmp_path, kind="bad option")
    assert result.returncode == 2 and "Invalid value for '--stall-timeout'" in result.stderr, result.stderr
    assert not result.traceback and not result.touched_outside([])


@pytest.mark.slow
def test_the_rank_that_failed_first_is_blamed_with_its_own_error(tmp_path: Path) -> None:
    # rank 1 raises; rank 0 then fails in its next all-reduce ("Connection closed by peer"): a consequence
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "2", "--warmup", "1", "--steps", "3",
                        "-o", str(out), str(COUNTED), "--crash-rank", "1"], watch=[tmp_path], cwd=tmp_path,
                       kind="script crash", expect="refused")
    result.assert_refused(r"first ddp x2: rank 1: ValueError: deliberate failure on rank 1", owned=[out])
    assert "Connection closed" not in result.error_lines[0]
    (run,) = results(out)
    assert run["status"] == "failed" and run["error"] == "rank 1: ValueError: deliberate failure on rank 1"


@pytest.mark.slow
def test_a_stall_is_reported_as_a_stall_with_the_stacks(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "2", "--warmup", "1", "--steps", "3",
                        "--stall-timeout", "3", "-o", str(out), str(COUNTED), "--hang-rank", "1"], watch=[tmp_path],
                       cwd=tmp_path, kind="hang", expect="refused", timeout=180)
    line = result.assert_refused(r"first ddp x2: stalled \(--stall-timeout\): no rank progressed for \d+ s; rank 1 "
                                 r"is not in any collective \(it is at \S*counted_train\.py:\d+ in <module>\)",
                                 owned=[out])
    assert "died before the first step" not in line
    (run,) = results(out)
    assert run["status"] == "stalled" and run["exit_code"] == 124
    log = (out / "runs" / "ddp-np2" / "output.log").read_text()
    assert "accelkit: rank 1 (pid" in log and "accelkit: rank 0 (pid" in log  # every rank's stack
    assert "counted_train.py\", line" in log


@pytest.mark.slow
def test_a_scripts_usage_error_is_shown_with_its_message(tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "1", "-o", str(out), str(COUNTED),
                        "--no-such-flag"], watch=[tmp_path], cwd=tmp_path, kind="script usage error",
                       expect="refused")
    result.assert_refused(r"first ddp x1: rank 0: counted_train\.py: error: unrecognized arguments: --no-such-flag",
                          owned=[out])


@pytest.mark.slow
def test_a_script_without_an_optimizer_step_is_told_so(tmp_path: Path) -> None:
    script = tmp_path / "evaluate.py"
    script.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\nprint(model(torch.ones(1, 2)).sum().item())\n")
    out = tmp_path / "out"
    result = run_fault(["bench", "--cpu", "--backend", "ddp", "--num-processes", "1", "-o", str(out), str(script)],
                       watch=[tmp_path], cwd=tmp_path, kind="no optimizer", expect="refused")
    line = result.assert_refused(r"first ddp x1: the script ended without an optimizer step", owned=[out])
    assert "--warmup" not in line
