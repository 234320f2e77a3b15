"""The launch supervisor with a stand-in launcher (no torch): signals reach the launcher, a launcher that hangs or
dies hard does not leave its ranks behind, and exit statuses come back shell-style."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

# A stand-in launcher: starts two "ranks" in sessions of their own (as torchrun does), reports their pids, then
# behaves as MODE says.
LAUNCHER = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    mode = sys.argv[1]
    ranks = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
             for _ in range(2)]
    print(" ".join(str(r.pid) for r in ranks), flush=True)
    if mode == "die":          # the launcher is killed hard: its ranks become orphans
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "hang":         # ignores SIGTERM and SIGINT: the supervisor must escalate
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    if mode == "exit3":
        sys.exit(3)
    time.sleep(600)
""")

# Runs the Supervisor in a process of its own (it installs signal handlers and becomes a subreaper).
DRIVER = textwrap.dedent("""
    import json, sys
    from accelkit.launch.supervisor import Supervisor
    launcher, mode, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
    status = Supervisor([sys.executable, launcher, mode], {}, grace=grace).run()
    print(json.dumps({"status": status}), flush=True)
""")


def _start(tmp_path: Path, mode: str, grace: float = 2.0) -> tuple[subprocess.Popen, list[int]]:
    launcher = tmp_path / "launcher.py"
    launcher.write_text(LAUNCHER)
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, str(launcher), mode, str(grace)],
                            stdout=subprocess.PIPE, text=True)
    ranks = [int(pid) for pid in proc.stdout.readline().split()]
    assert len(ranks) == 2
    return proc, ranks


def _finish(proc: subprocess.Popen) -> int:
    out, _ = proc.communicate(timeout=30)
    return json.loads(out.strip().splitlines()[-1])["status"]


def _gone(pids: list[int]) -> bool:
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=5)
    return not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE]


def test_launcher_killed_hard_leaves_no_orphan_ranks(tmp_path):
    proc, ranks = _start(tmp_path, "die")
    assert _finish(proc) == 128 + signal.SIGKILL
    assert _gone(ranks)


def test_sigterm_escalates_to_sigkill_when_the_launcher_hangs(tmp_path):
    proc, ranks = _start(tmp_path, "hang", grace=1.0)
    time.sleep(0.5)
    started = time.time()
    proc.send_signal(signal.SIGTERM)
    status = _finish(proc)
    # The status says why the job ended (SIGTERM), not how the hung launcher was finally stopped (SIGKILL).
    assert status == 128 + signal.SIGTERM and time.time() - started < 15
    assert _gone(ranks)


def test_ctrl_c_twice_kills_at_once_and_exits_130(tmp_path):
    proc, ranks = _start(tmp_path, "hang", grace=60.0)  # the grace period alone would take a minute
    time.sleep(0.5)
    started = time.time()
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    assert _finish(proc) == 130 and time.time() - started < 15
    assert _gone(ranks)


def test_exit_status_passes_through_and_leftovers_are_stopped(tmp_path):
    proc, ranks = _start(tmp_path, "exit3")
    assert _finish(proc) == 3
    assert _gone(ranks)
