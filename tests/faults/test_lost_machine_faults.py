"""`--lost-timeout` (accelkit.launch.cluster.heartbeat): a value that is not a finite, non-negative number of seconds
is a usage error (exit 2), one line, before anything starts, leaving nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault

PROBE = DATA / "launch" / "probe.py"


@pytest.mark.parametrize(("value", "words"), [
    ("nan", r"'--lost-timeout': 'nan' is not a finite number of seconds"),
    ("inf", r"'--lost-timeout': 'inf' is not a finite number of seconds"),
    ("-5", r"'--lost-timeout': '-5' is less than 0 second\(s\)"),
    ("soon", r"'--lost-timeout': 'soon' is not a number of seconds"),
])
def test_bad_lost_timeouts_are_usage_errors(value: str, words: str, tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", "--lost-timeout", value, str(PROBE)],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(words, exit_code=2, hint=False)


def test_a_bad_lost_timeout_in_a_cluster_job_writes_no_job_file(tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--slurm", "job.sbatch", "--num-machines", "2", "--gpus-per-node", "1",
                           "--lost-timeout", "-1", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"'--lost-timeout': '-1' is less than 0 second\(s\)", exit_code=2, hint=False)
    assert not (tmp_path / "job.sbatch").exists()
