"""A lost machine, named (accelkit.launch.cluster.heartbeat), on two node launchers on loopback, as SkyPilot or a
TrainJob would start them (machine 0 hosts the job board). Machine 1 is "lost" by killing every one of its
processes at once (a node crash) or by freezing them all (SIGSTOP: it stops answering, as a partitioned machine
does; its sockets stay open, so the ranks on machine 0 hang in their collective). Either way machine 0 ends the
job within the lost timeout and names the machine, its node, its address and its step; its own ranks, which
failed only because their peer vanished, are never named as the cause."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from helpers import DATA

from accelkit.launch.ports import free_port, port_free
from accelkit.launch.request import LaunchRequest
from accelkit.scaffold import init_project

pytestmark = pytest.mark.slow
LOST_TIMEOUT = 8
TRAIN_ARGS = ["--max-steps", "100000", "--num-samples", "4096", "--per-device-batch-size", "8", "--log-every", "20",
              "--lr-scheduler", "constant", "--warmup-steps", "0"]
KILL_AT_STEP = DATA / "restarts" / "kill_at_step.py"


def two_free_ports() -> int:
    while True:
        port = free_port("")
        if port < 65535 and port_free(port + 1):
            return port


class Node:
    """One node launcher (`python -m accelkit.launch.cluster.node`) in a session of its own; its output, read live."""

    def __init__(self, project: Path, machine: int, port: int, request: str, extra_env: dict | None = None) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELKIT_")}
        env.update({"ACCELKIT_LAUNCH_REQUEST": request, "ACCELKIT_JOB_KEY": "0123456789abcdef", **(extra_env or {})})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "accelkit.launch.cluster.node", "--machine-rank", str(machine), "--main-process-ip",
             "127.0.0.1", "--main-process-port", str(port), "--job-board-port", str(port + 1), "--node-name",
             f"node{machine}"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.extend(line.replace("\r", "\n").splitlines())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.text):
            assert self.proc.poll() is None, self.text
            assert time.monotonic() < deadline, self.text
            time.sleep(0.2)

    def tree(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root, *root.children(recursive=True)]

    def kill_all(self) -> None:
        with_tree = []
        with contextlib.suppress(psutil.Error):
            with_tree = self.tree()
        for proc in with_tree:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(signal.SIGCONT)
                proc.kill()
        self.proc.wait(timeout=30)
        psutil.wait_procs(with_tree, timeout=30)  # a killed rank of a loaded machine takes a moment to be gone
        self.reader.join(timeout=10)


def request_json(project: Path, *script: str, lost_timeout: float = LOST_TIMEOUT, max_restarts: int | None = None
                 ) -> str:
    from click.testing import CliRunner

    from accelkit.cli import cli

    args = ["launch", "--cpu", "--skypilot", "task.yaml", "--nodes", "2", "--gpus-per-node", "1", "--force",
            "--lost-timeout", str(lost_timeout)]
    if max_restarts is not None:
        args += ["--max-restarts", str(max_restarts)]
    cwd = os.getcwd()
    os.chdir(project)
    try:
        result = CliRunner().invoke(cli, [*args, *script], catch_exceptions=False)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, result.output
    import yaml

    text = yaml.safe_load((project / "task.yaml").read_text())["envs"]["ACCELKIT_LAUNCH_REQUEST"]
    assert LaunchRequest.from_json(text).lost_timeout == lost_timeout
    return text


@pytest.mark.parametrize("fault", ["crash", "partition"])
def test_a_lost_machine_is_named_by_machine_zero_within_the_lost_timeout(tmp_path: Path, fault: str) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    request = request_json(project, "train.py", *TRAIN_ARGS, "--output-dir", "out")
    port = two_free_ports()
    machine0 = Node(project, 0, port, request)
    machine1 = Node(project, 1, port, request)
    try:
        machine0.wait_for(r"step 40 \| loss")
        tree = machine1.tree()
        lost_at = time.monotonic()
        for proc in tree:  # all at once: nothing of machine 1 gets to say goodbye
            proc.send_signal(signal.SIGKILL if fault == "crash" else signal.SIGSTOP)
        status = machine0.proc.wait(timeout=LOST_TIMEOUT + 60)
        took = time.monotonic() - lost_at
        machine0.reader.join(timeout=10)
    finally:
        machine0.kill_all()
        machine1.kill_all()
    text = machine0.text
    assert status == 1, text
    assert took < LOST_TIMEOUT + 15, (took, text)
    found = re.search(r"accelkit: machine 1 \(node node1, address 127\.0\.0\.1\) was lost: no heartbeat for (\d+) s "
                      r"\(its processes are gone or it is unreachable\); its ranks were last at step (\d+)", text)
    assert found, text
    # Its step: from its last beat (one a second), so at most the step machine 0's rank 0 last logged.
    logged = [int(step) for step in re.findall(r"step (\d+) \| loss", text)]
    # A crash has a witness (machine 0's ranks lost their connection to its address): judged after 3 s of silence
    # once they failed (on a loaded machine they may notice late); a frozen machine has none: the whole timeout.
    silent = int(found.group(1))
    assert (3 <= silent <= LOST_TIMEOUT + 2) if fault == "crash" else (LOST_TIMEOUT <= silent <= LOST_TIMEOUT + 2), \
        text
    # The tiny model takes 40+ steps a second, so the last beat (one a second) may come before its first optimizer
    # step: 0 is a true "last at step" (measured: 0, 3, 4 and 11 when machine 0 logged 40-60).
    assert 0 <= int(found.group(2)) <= logged[-1] + 20, text
    assert text.rstrip().splitlines()[-1].startswith("accelkit: the job failed: machine 1 (node node1"), text
    assert "failed first" not in text, text  # machine 0's ranks only lost their peer
    assert not [proc for proc in tree if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE]


def test_a_rank_failing_on_machine_one_is_named_not_the_peer_that_lost_it(tmp_path: Path) -> None:
    project = init_project(tmp_path / "proj", "minimal", backend="ddp").directory
    shutil.copy(KILL_AT_STEP, project / "kill_at_step.py")
    request = request_json(project, "kill_at_step.py", "train.py", *TRAIN_ARGS, "--output-dir", "out")
    port = two_free_ports()
    env = {"KILL_RANK": "1", "KILL_STEP": "30", "KILL_SIGNAL": "SIGSEGV"}
    machine0, machine1 = Node(project, 0, port, request, env), Node(project, 1, port, request, env)
    try:
        status = machine0.proc.wait(timeout=240)
        machine1.proc.wait(timeout=60)
        machine0.reader.join(timeout=10)
    finally:
        machine0.kill_all()
        machine1.kill_all()
    text = machine0.text
    assert status == 128 + signal.SIGSEGV, text
    assert text.rstrip().splitlines()[-1] == ("accelkit: the job failed: rank 1 on node node1 (machine 1) was killed "
                                              f"by SIGSEGV (exit {128 + signal.SIGSEGV})"), text
    assert "was lost" not in text
