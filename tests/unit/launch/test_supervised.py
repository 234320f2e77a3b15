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
