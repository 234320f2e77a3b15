"""The harness itself: `invoke_fault` (a command in this process) observes what `run_fault` (a real `python -m
accelkit` process) observes, and leaves this process as it found it.

The fault files run their refusals in process; the parity test below runs one of each file's cases both ways (the
real-process twins) and compares everything the contract looks at. Neither run of a twin is recorded for the fault
catalogue, whose counts stay one per case."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import _descriptors_captured, invoke_fault, run_fault

PROBE = DATA / "launch" / "probe.py"


def _special_target(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "out.yaml")
    return ["config", "--backend", "ddp", "-o", str(tmp / "out.yaml"), "--force"]


def _syntax_error(tmp: Path) -> list[str]:
    (tmp / "broken.py").write_text("import torch\n\ndef main(:\n    pass\n")
    return ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2", "broken.py"]


def _file_in_the_way(tmp: Path) -> list[str]:
    (tmp / "afile").write_text("x")
    return ["config", "--backend", "ddp", "-o", str(tmp / "afile" / "ddp.yaml")]


# one case per fault file that runs its refusals in process; each gets a folder holding train.py (the probe script)
TWINS = {
    "special targets": _special_target,
    "cluster targets": lambda tmp: ["launch", "--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "8",
                                    "--accelerator", "H1000", "train.py"],
    "launch options (usage error)": lambda tmp: ["launch", "--cpu", "--num-processes", "2", "--max-restarts", "-1",
                                                 "train.py"],
    "launch (before any process)": _syntax_error,
    "plan": lambda tmp: ["plan", "--params", "7X", "--gpu-memory", "80GB", "--gpus", "1"],
    "slurm": lambda tmp: ["launch", "--backend", "ddp", "--slurm", "job.sbatch", "--nodes", "3", "--num-processes",
                          "4", "train.py"],
    "bench": lambda tmp: ["bench", "--cpu", "--num-processes", "1,two", "-o", str(tmp / "out"), "train.py"],
    "convert": lambda tmp: ["convert", "train.py", "--exit-code"],
    "write": _file_in_the_way,
    "grad compression": lambda tmp: ["launch", "--cpu", "--backend", "ddp", "--num-processes", "2",
                                     "--grad-compression", "bf16", "train.py"],
}


@pytest.mark.slow  # a real `python -m accelkit` per case
@pytest.mark.parametrize("case", list(TWINS))
def test_in_process_and_real_process_observe_the_same(case: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text(PROBE.read_text())
    args = TWINS[case](tmp_path)
    real = run_fault(args, watch=[tmp_path], cwd=tmp_path, record=False)
    here = invoke_fault(args, watch=[tmp_path], cwd=tmp_path, record=False)
    assert real.returncode != 0 and real.error_lines, real.stderr
    for name in ("returncode", "stdout", "stderr", "created", "changed", "deleted", "leftovers", "orphans",
                 "traceback"):
        assert getattr(here, name) == getattr(real, name), f"{name}: {getattr(here, name)!r} in process, " \
                                                             f"{getattr(real, name)!r} in a real process"


def test_the_process_is_left_as_it_was(tmp_path: Path) -> None:
    environ, tempdir, cwd = dict(os.environ), tempfile.tempdir, os.getcwd()
    handlers = [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)]
    result = invoke_fault(["plan", "--params", "7X", "--gpu-memory", "80GB", "--gpus", "1"], watch=[tmp_path],
                          cwd=tmp_path, env={"ACCELKIT_TEST_ONLY": "1"}, record=False)
    result.assert_refused(r"--params '7X' is not a count")
    assert dict(os.environ) == environ and tempfile.tempdir == tempdir and os.getcwd() == cwd
    assert [signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)] == handlers


def test_what_the_command_writes_is_seen(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    result = invoke_fault(["init", str(project), "--template", "minimal"], watch=[tmp_path], expect="ok",
                          record=False)
    assert result.returncode == 0, result.stderr
    assert str(project / "train.py") in result.created and "Created" in result.stdout
    with pytest.raises(AssertionError, match="created/changed/deleted outside"):
        result.assert_clean()
    result.assert_clean(owned=[project])


def test_what_child_processes_write_to_the_descriptors_is_captured() -> None:
    with _descriptors_captured() as written:
        os.system("echo to-stdout; echo to-stderr >&2")
    assert written == {"stdout": "to-stdout\n", "stderr": "to-stderr\n"}
