"""The sweep's failure policy with the launches replaced by recorded outcomes: a script error before any success
stops the sweep; out of memory, a killed rank or a failure after a success is recorded and the sweep goes on;
an interruption stops it."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from accelkit.bench import sweep as sweep_module
from accelkit.bench.launching import LaunchSettings
from accelkit.bench.spec import BenchSpec
from accelkit.bench.sweep import Sweep
from accelkit.configs.options import ConfigOptions
from accelkit.launch import RunOutcome


def outcome(exit_code: int, seconds: float, signal: int | None = None) -> RunOutcome:
    status = "ok" if exit_code == 0 else "interrupted" if signal else "failed"
    return RunOutcome(status, exit_code, seconds, signal=signal)


OK = (outcome(0, 1.0), None)


def ranks_for(n: int, error: str | None = None) -> list[dict]:
    steps = [{"step": i, "seconds": 0.1, "data_wait_s": 0.0, "samples": 4, "tokens": 0} for i in range(1, 4)]
    return [{"rank": r, "steps": steps, "error": error, "peak_memory_bytes": 1} for r in range(n)]


def run_sweep(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, outcomes: dict[int, tuple[RunOutcome, str | None]],
              sizes=(1, 2, 4, 8)) -> Sweep:
    launched: list[int] = []
    current: dict[str, int] = {}

    def fake_launch(request, **kwargs) -> RunOutcome:
        n = request.options.num_processes
        launched.append(n)
        current["n"] = n
        return outcomes.get(n, OK)[0]

    def fake_results(folder: Path, probe: str) -> list[dict]:
        n = current["n"]
        return ranks_for(n, outcomes.get(n, OK)[1])

    monkeypatch.setattr(sweep_module, "run_bench_launch", fake_launch)
    monkeypatch.setattr(sweep_module, "read_results", fake_results)
    spec = BenchSpec(script="train.py", script_args=(), module=False, world_sizes=sizes, backends=("ddp",), steps=2,
                     warmup=1, cpu=True, output=tmp_path)
    sweep = Sweep(spec, LaunchSettings(options=ConfigOptions()), {"ddp": "ddp"}, {}, lambda line: None,
                  lambda s: None)
    sweep.run_script()
    sweep.launched = launched  # type: ignore[attr-defined]
    return sweep


def test_a_script_error_before_any_success_stops_the_sweep(tmp_path, monkeypatch) -> None:
    sweep = run_sweep(tmp_path, monkeypatch, {1: (outcome(1, 1.0), "ValueError: bad flag")})
    assert sweep.launched == [1] and "stopped" in sweep.stopped
    assert sweep.records[0].error == "rank 0: ValueError: bad flag"


def test_out_of_memory_at_first_goes_on(tmp_path, monkeypatch) -> None:
    sweep = run_sweep(tmp_path, monkeypatch, {1: (outcome(1, 1.0), "OutOfMemoryError: CUDA out of memory"),
                                              2: (outcome(128 + signal.SIGKILL, 1.0), None)})
    assert sweep.launched == [1, 2, 4, 8] and sweep.stopped is None
    assert [r.status for r in sweep.records] == ["failed", "failed", "ok", "ok"]
    assert "SIGKILL" in sweep.records[1].error
    sweep.finish()  # the baseline is the smallest world size that succeeded
    assert sweep.records[2].scaling.baseline_num_processes == 4 and sweep.records[3].scaling.speedup == 2.0


def test_failures_after_a_success_are_recorded_and_the_sweep_goes_on(tmp_path, monkeypatch) -> None:
    sweep = run_sweep(tmp_path, monkeypatch, {4: (outcome(1, 1.0), "RuntimeError: NCCL timeout")})
    assert sweep.launched == [1, 2, 4, 8] and [r.status for r in sweep.records] == ["ok", "ok", "failed", "ok"]


def test_an_interruption_stops_the_sweep(tmp_path, monkeypatch) -> None:
    sweep = run_sweep(tmp_path, monkeypatch, {2: (outcome(130, 1.0, signal=signal.SIGINT), None)})
    assert sweep.launched == [1, 2] and sweep.stopped == "interrupted" and sweep.interrupted_by == signal.SIGINT
    assert sweep.records[1].status == "interrupted"


def test_a_script_that_ends_before_the_limit_is_named(tmp_path, monkeypatch) -> None:
    sweep = run_sweep(tmp_path, monkeypatch, {}, sizes=(1,))  # 3 steps done, warmup 1 + steps 2 asked: enough
    assert sweep.records[0].note is None
    sweep.spec = BenchSpec(**{**sweep.spec.__dict__, "steps": 5})
    record = sweep._run_one(sweep.spec.runs()[0])
    assert record.status == "ok" and record.note.startswith("the script ended after 3 steps: 2 measured")


def test_the_rank_that_failed_first_is_blamed_not_a_peer_that_failed_because_of_it() -> None:
    from accelkit.bench.sweep import run_failure_line

    ranks = [{"rank": 0, "error": "RuntimeError: Connection closed by peer"}, {"rank": 1, "error": "ValueError: x"}]
    first = RunOutcome("failed", 1, 1.0, failed_rank=1, error="ValueError: x")
    assert run_failure_line(first, ranks, 2) == "rank 1: ValueError: x"
    stalled = RunOutcome("stalled", 124, 9.0, stalled=True, error="no rank progressed for 5 s; rank 1 is not ...")
    assert run_failure_line(stalled, ranks[:0], 2) == "stalled (--stall-timeout): no rank progressed for 5 s; rank 1 " \
                                                      "is not ..."


def test_a_script_that_never_steps_an_optimizer_is_told_so(tmp_path, monkeypatch) -> None:
    from accelkit.bench.sweep import NO_OPTIMIZER_STEP

    sweep = run_sweep(tmp_path, monkeypatch, {}, sizes=(1,))
    monkeypatch.setattr(sweep_module, "read_results", lambda folder, probe: [{"rank": 0, "steps": [], "error": None}])
    record = sweep._run_one(sweep.spec.runs()[0])
    assert record.status == "failed" and record.error == NO_OPTIMIZER_STEP and "--warmup" not in record.error
