"""The supervised-run API on plain processes (no torch, so fast): the outcome of a failure names the rank and its
own error (an exception, an argparse message), a stall comes back as a stall with the stack, a deadline as a time-out
with the stack, output goes to files, the environment is a parameter and os.environ is never changed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from accelkit.launch import ScriptProcess, Stream, SupervisedRun, run_supervised


def script(tmp_path: Path, text: str) -> str:
    path = tmp_path / "job.py"
    path.write_text(text)
    return str(path)


def test_a_failure_names_the_rank_and_its_own_error_and_output_goes_to_files(tmp_path: Path) -> None:
    job = ScriptProcess(script(tmp_path, "import os, sys\nprint('out', os.environ['ANSWER'])\n"
                                         "print('err', file=sys.stderr)\nraise KeyError('missing')\n"))
    before = dict(os.environ)
    outcome = run_supervised(SupervisedRun(job, env={**os.environ, "ANSWER": "42"}, cwd=tmp_path,
                                           stdout=tmp_path / "out.txt", stderr=tmp_path / "err.txt"))
    assert dict(os.environ) == before  # the environment was a parameter
    assert (outcome.status, outcome.exit_code, outcome.failed_rank) == ("failed", 1, 0)
    assert outcome.error == "KeyError: 'missing'"
    assert (tmp_path / "out.txt").read_text() == "out 42\n"
    assert "err\n" in (tmp_path / "err.txt").read_text() and "KeyError" in (tmp_path / "err.txt").read_text()


def test_a_usage_error_comes_back_with_its_message(tmp_path: Path) -> None:
    job = ScriptProcess(script(tmp_path, "import argparse\nargparse.ArgumentParser().parse_args()\n"), ("--nope",))
    outcome = run_supervised(SupervisedRun(job, stdout=tmp_path / "log.txt", stderr=Stream.STDOUT))
    assert outcome.exit_code == 2 and outcome.error == "job.py: error: unrecognized arguments: --nope"
    assert "usage: job.py" in (tmp_path / "log.txt").read_text()


def test_a_success_is_ok(tmp_path: Path) -> None:
    outcome = run_supervised(SupervisedRun(ScriptProcess(script(tmp_path, "pass\n")), stdout=Stream.STDERR))
    assert outcome.ok and outcome.exit_code == 0 and outcome.error is None


def test_a_stall_is_stopped_with_the_stack(tmp_path: Path) -> None:
    job = ScriptProcess(script(tmp_path, "import time\n\ndef wait():\n    time.sleep(600)\n\nwait()\n"))
    outcome = run_supervised(SupervisedRun(job, stall_timeout=1.5, stdout=tmp_path / "log.txt",
                                           stderr=Stream.STDOUT, grace=2))
    assert (outcome.status, outcome.exit_code, outcome.stalled) == ("stalled", 124, True)
    assert "rank 0 at" in outcome.error and "job.py:4 in wait" in outcome.error
    assert "--stall-timeout (now 1.5 s" in outcome.hint
    (stack,) = outcome.stacks
    assert [frame.function for frame in stack.frames][-2:] == ["<module>", "wait"]
    assert 'job.py", line 4, in wait' in (tmp_path / "log.txt").read_text()  # the supervisor's lines go there too


def test_a_deadline_stops_a_busy_job_with_its_stack(tmp_path: Path) -> None:
    job = ScriptProcess(script(tmp_path, "while True:\n    pass\n"))  # busy: never a stall
    outcome = run_supervised(SupervisedRun(job, deadline=2, stall_timeout=0, stdout=tmp_path / "log.txt",
                                           stderr=Stream.STDOUT, grace=2))
    assert (outcome.status, outcome.exit_code, outcome.timed_out) == ("timed out", 124, True)
    assert 2 <= outcome.seconds < 30 and outcome.stacks and "time limit (2 s)" in outcome.error


@pytest.mark.parametrize("field", ["stall_timeout", "deadline"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_a_time_that_is_not_a_finite_number_of_seconds_is_refused(field: str, value: float) -> None:
    with pytest.raises(ValueError, match=field):
        SupervisedRun(ScriptProcess(sys.executable), **{field: value})


def test_the_launcher_names_the_cause_not_a_consequence(tmp_path: Path) -> None:
    """accelerate_main's choice among torchrun's failures (same-second timestamps), with the ranks' own records."""
    import signal
    from types import SimpleNamespace

    from accelkit.launch.accelerate_main import _first_failure
    from accelkit.ranks.rank_files import RankFailure, RankFiles, write_failure

    def failed(**ranks):  # rank -> (pid, exit code)
        failures = {int(r[1:]): SimpleNamespace(pid=pid, exitcode=code, timestamp=100) for r, (pid, code) in
                    ranks.items()}
        return SimpleNamespace(failures=failures, get_first_failure=lambda: min(failures.items()))

    def record(pid: int, rank: int, when: float) -> None:
        write_failure(RankFiles.of(tmp_path, pid), RankFailure(rank, pid, "E", 1, when))

    # rank 1 killed by SIGKILL; rank 0 recorded its "Connection closed" and was then stopped by SIGTERM
    record(10, 0, 5.0)
    assert _first_failure(failed(r0=(10, -signal.SIGTERM), r1=(11, -signal.SIGKILL)), tmp_path)[0] == 1
    # rank 1 raised first (recorded earlier than rank 0's consequence)
    record(11, 1, 4.0)
    assert _first_failure(failed(r0=(10, 1), r1=(11, 1)), tmp_path)[0] == 1
    # rank 1 exited by itself without a record; rank 0 was only stopped by the launcher
    assert _first_failure(failed(r0=(20, -signal.SIGTERM), r1=(21, 7)), tmp_path / "none")[0] == 1


def test_a_rank_stopped_while_it_reported_its_own_error_failed_of_that_error(tmp_path: Path) -> None:
    """Both ranks raise at once; rank 0 records first and torchrun's SIGTERM reaches it mid-traceback: the job failed
    with rank 0's exception (exit status 1), not 'died of SIGTERM' (143) - the CI flake of stop 25."""
    from accelkit.launch.accelerate_main import _recorded_exit_code
    from accelkit.ranks.rank_files import RankFailure, RankFiles, write_failure

    write_failure(RankFiles.of(tmp_path, 10), RankFailure(0, 10, "RuntimeError: lossss", 1, 4.0))
    assert _recorded_exit_code(10, tmp_path) == 1
    assert _recorded_exit_code(11, tmp_path) is None  # a rank that recorded nothing keeps torchrun's status
    assert _recorded_exit_code(10, None) is None
