"""The preemption decision's pieces: which processes catch the save request (the kernel's record of handlers), and
the lines said."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from accelkit.launch.preemption import PREEMPTED_EXIT_STATUS, catching_save_request, preempted_summary


def fake_proc(tmp_path: Path, pid: int, caught: int) -> Path:
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text(f"Name:\tpython\nSigIgn:\t0000000001001000\nSigCgt:\t{caught:016x}\n")
    return tmp_path


def test_the_sigusr1_bit_of_sigcgt_decides(tmp_path: Path) -> None:
    fake_proc(tmp_path, 1, 1 << (signal.SIGUSR1 - 1) | 1 << (signal.SIGINT - 1))
    fake_proc(tmp_path, 2, 1 << (signal.SIGINT - 1) | 1 << (signal.SIGUSR2 - 1))
    assert catching_save_request(1, tmp_path)
    assert not catching_save_request(2, tmp_path)
    assert not catching_save_request(3, tmp_path)  # gone


def test_a_real_process_with_and_without_the_handler() -> None:
    code = ("import signal, sys, time\nif sys.argv[1] == 'catch':\n    signal.signal(signal.SIGUSR1, lambda *a: None)\n"
            "print('ready', flush=True)\ntime.sleep(30)\n")
    procs = {mode: subprocess.Popen([sys.executable, "-c", code, mode], stdout=subprocess.PIPE, text=True)
             for mode in ("catch", "plain")}
    try:
        for proc in procs.values():
            assert proc.stdout.readline().strip() == "ready"
        assert catching_save_request(procs["catch"].pid)
        assert not catching_save_request(procs["plain"].pid)
        assert not catching_save_request(os.getpid()) or signal.getsignal(signal.SIGUSR1) not in (
            signal.SIG_DFL, signal.SIG_IGN)
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
        time.sleep(0)


def test_the_summary_says_whether_the_save_finished() -> None:
    assert PREEMPTED_EXIT_STATUS == 143
    assert "saved a checkpoint and stopped" in preempted_summary(0, 120, killed=False)
    assert "did not finish their save within 120 s" in preempted_summary(0, 120, killed=True)
