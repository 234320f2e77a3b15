"""Bad launch options and config files (issue 14, items 6, 8, 10 and 13): each is one clear message before anything
starts, with the same words wherever the same problem is found, and leaves nothing behind. The refusals made in the
`accelkit` process run in process (`invoke_fault`); those made by launch's worker process (which resolves the
config with torch and Accelerate) run `accelkit` as a real process (`run_fault`)."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

PROBE = DATA / "launch" / "probe.py"


def _message(error_line: str) -> str:
    """The words of an `Error:` line without a file prefix (`x.yaml: ...`), for comparing two commands."""
    return re.sub(r"^Error: (\S+\.yaml: )?", "", error_line)


@pytest.mark.parametrize(("option", "value", "words"), [
    ("--max-restarts", "-1", r"'--max-restarts': -1 is not in the range 0<=x<=10000"),
    ("--monitor-interval", "-3", r"'--monitor-interval': -3.0 is not in the range 0<x<=3600"),
    # issue 32 item 3: ceilings a real run could meet
    ("--max-restarts", str(10**20), r"'--max-restarts': 100000000000000000000 is not in the range 0<=x<=10000"),
    ("--monitor-interval", "1e300", r"'--monitor-interval': 1e\+300 is not in the range 0<x<=3600"),
    ("--stall-timeout", "1e300", r"'--stall-timeout': '1e300' seconds is more than 30 days"),
    ("--stall-timeout", "nan", r"'--stall-timeout': 'nan' is not a finite number of seconds"),  # issue 19 item 10
    ("--rdzv-conf", "garbage", r"'--rdzv-conf': 'garbage' is not KEY=VALUE"),
    ("--rdzv-backend", "bogus", r"'--rdzv-backend': 'bogus' is not one of 'static', 'c10d'"),
    ("--config", "", r"'--config': the path is empty"),
    ("--slurm", "", r"'--slurm': the path is empty"),
])
def test_bad_launch_options_are_usage_errors(option: str, value: str, words: str, tmp_path: Path) -> None:
    """Item 8: one usage error each (exit 2), no traceback, before any process starts."""
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", option, value, str(PROBE)], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(words, exit_code=2, hint=False)


def test_rendezvous_port_in_use_is_refused_before_ranks_start(tmp_path: Path) -> None:
    """Item 8: machine 0 of a multi-node job cannot listen on its port: one line instead of torch's traceback."""
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_fault(["launch", "--cpu", "--backend", "ddp", "--num-machines", "2", "--num-processes", "2",
                            "--machine-rank", "0", "--main-process-ip", "127.0.0.1", "--main-process-port", str(port),
                            str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(rf"port {port} \(--main-process-port\) is already in use on this machine")


def test_natural_cpu_command_is_never_refused_with_a_flag_it_did_not_give(tmp_path: Path) -> None:
    """Item 6: `--num-processes 2` without --backend means 2 data-parallel processes; on a machine without GPUs the
    refusal says the default was chosen (and how to run it on CPU), never `--backend ...`."""
    result = run_fault(["launch", "--num-processes", "2", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    line = result.assert_refused(r"backend ddp \(default for 2 processes\) runs on GPUs, and this machine has none")
    assert "--backend" not in line and "--cpu" in result.stderr
    result = invoke_fault(["launch", "--cpu", "--num-processes", "2", "--zero-stage", "3", str(PROBE)],
                          watch=[tmp_path], cwd=tmp_path)
    line = result.assert_refused(r"--zero-stage is a DeepSpeed option, but the backend is cpu \(--cpu\)")


@pytest.mark.slow  # two CLI runs that import torch and accelerate; in process: tests/unit/configs/test_config_cli.py
def test_check_and_launch_give_one_verdict_in_the_same_words(tmp_path: Path) -> None:
    """Item 10: two machines and no main_process_ip: `config --check` and `launch --config` both refuse it, with
    the same message; `accelkit config` refuses to write it."""
    config = tmp_path / "two_nodes.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 4\nnum_machines: 2\nmachine_rank: 0\n")
    check = run_fault(["config", "--check", str(config)], watch=[tmp_path])
    check.assert_refused("no main_process_ip")
    launch = run_fault(["launch", "--config", str(config), "--cpu", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    launch.assert_refused("no main_process_ip")
    assert _message(check.error_lines[0]) == _message(launch.error_lines[0])
    assert check.stderr.split("Hint: ")[1].splitlines()[0] == launch.stderr.split("Hint: ")[1].splitlines()[0]
    written = run_fault(["config", "--backend", "ddp", "--num-machines", "2", "-o", str(tmp_path / "out.yaml")],
                        watch=[tmp_path])
    written.assert_refused(r"--num-machines 2 but no main_process_ip")


def test_empty_output_path_says_it_is_empty(tmp_path: Path) -> None:
    """Item 13: `config -o ""` used to say "Error: . already exists"."""
    result = invoke_fault(["config", "--backend", "ddp", "-o", ""], watch=[tmp_path], cwd=tmp_path)
    line = result.assert_refused(r"'-o' / '--output': the path is empty", exit_code=2, hint=False)
    assert "already exists" not in line
    result = invoke_fault(["config", "--check", ""], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"'--check': the path is empty", exit_code=2, hint=False)


@pytest.mark.parametrize(("text", "where", "problem"), [
    ("distributed_type: [MULTI_GPU\nnum_processes: 2\n", "2:14", "expected ',' or ']'"),
    ("distributed_type: MULTI_GPU\n  num_processes: 2\n", "2:16", "mapping values are not allowed here"),
    ("distributed_type: MULTI_GPU\nnum_processes: 2\n\tuse_cpu: true\n", "3:1", "found character '\\\\t'"),
])
def test_malformed_yaml_names_file_line_and_column(text: str, where: str, problem: str, tmp_path: Path) -> None:
    """Item 13: `config --check` and `launch --config` name the file, the line and the column of a YAML error."""
    config = tmp_path / "broken.yaml"
    config.write_text(text)
    expected = rf"{re.escape(str(config))}:{where}: not valid YAML: .*{problem}"
    check = invoke_fault(["config", "--check", str(config)], watch=[tmp_path])
    launch = invoke_fault(["launch", "--config", str(config), "--cpu", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    assert check.assert_refused(expected) == launch.assert_refused(expected)


@pytest.mark.slow  # two CLI runs that import torch and accelerate
def test_cpu_world_size_beyond_memory_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    """`bench --cpu --num-processes 100000` used to start the ranks (load average 121 on 2 cores)."""
    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    for args in (["launch", "--cpu", "--num-processes", "100000", "--dry-run", str(script)],
                 ["bench", "--cpu", "--num-processes", "100000", "-o", str(tmp_path / "out"), str(script)]):
        result = run_fault(args, watch=[tmp_path], timeout=120)
        result.assert_refused("100000 CPU processes need at least")


def test_many_more_cpu_ranks_than_cores_is_said_in_the_dry_run(tmp_path: Path) -> None:
    import os

    script = tmp_path / "train.py"
    script.write_text("print('never run')\n")
    ranks = 4 * (os.cpu_count() or 1) + 1
    result = invoke_fault(["launch", "--cpu", "--num-processes", str(ranks), "--dry-run", str(script)],
                          watch=[tmp_path], expect="ok")
    assert result.returncode == 0, result.stderr
    assert f"{ranks} CPU processes on {os.cpu_count()} cores" in result.stdout + result.stderr
