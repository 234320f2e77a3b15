"""The per-rank pieces, each in a real one-rank process started through the bootstrap: the watch probe (stack dumps
on demand, crash dumps, optimizer step counts, registration) and known failures left for the launcher to report.
The CPU mapping of hand-written GPU code is tested with 2 ranks in tests/integration/test_rehearsal_fidelity.py.
The tests that import torch in their process are marked slow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from accelkit.launch.failures import rank_died
from accelkit.launch.ports import free_port
from accelkit.launch.rank_monitor import RankMonitor
from accelkit.ranks.rank_files import RankFiles, read_steps, registered_ranks

WATCH = "accelkit.ranks.watch"


def start(tmp_path: Path, source: str, env: dict[str, str]) -> subprocess.Popen[str]:
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(source))
    full_env = {k: v for k, v in os.environ.items() if k not in ("ACCELKIT_REHEARSAL", "ACCELKIT_PROBES")}
    full_env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                     "MASTER_PORT": str(free_port()), **env})
    return subprocess.Popen([sys.executable, "-m", "accelkit.ranks.bootstrap", str(script)], cwd=tmp_path,
                            env=full_env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


@pytest.mark.slow
def test_watch_probe_counts_steps_and_dumps_the_stack_on_demand(tmp_path):
    watch = tmp_path / "watch"
    proc = start(tmp_path, """
        import sys, time
        import torch
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        print("STEPPED", flush=True); time.sleep(60)  # one line: the stack shows it, before or in the sleep
    """, {"ACCELKIT_PROBES": WATCH, "ACCELKIT_WATCH_DIR": str(watch)})
    try:
        assert proc.stdout.readline().strip() == "STEPPED"
        [info] = registered_ranks(watch)
        assert (info.pid, info.rank, info.cpu_job) == (proc.pid, 0, False)
        assert read_steps(RankFiles.of(watch, info.pid)) == 3
        [stack] = RankMonitor(watch).dump_stacks([info])
        assert stack.where().endswith("user_script.py:9 in <module>")
        assert proc.poll() is None  # dumping the stack does not disturb the rank
    finally:
        proc.kill()
        proc.communicate()


def test_rank_killed_by_a_signal_is_named_with_its_line(tmp_path):
    watch = tmp_path / "watch"
    proc = start(tmp_path, """
        import ctypes
        def read_null():
            return ctypes.string_at(0)  # SIGSEGV
        read_null()
    """, {"ACCELKIT_PROBES": WATCH, "ACCELKIT_WATCH_DIR": str(watch)})
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGSEGV
    lines, error = rank_died(0, proc.pid, signal.SIGSEGV, watch)
    assert error.message.startswith(f"rank 0 (pid {proc.pid}) died of SIGSEGV at ")
    assert "user_script.py:4 in read_null" in error.message
    assert error.exit_code == 139 and "native code" in error.hint
    assert lines[0].startswith("accelkit: rank 0") and any("read_null" in line for line in lines)


def test_killed_without_a_dump_still_names_the_signal(tmp_path):
    lines, error = rank_died(1, 4321, signal.SIGKILL, tmp_path)
    assert lines == []
    assert error.message == "rank 1 (pid 4321) died of SIGKILL; the launcher stopped the other ranks"
    assert "out-of-memory" in error.hint and error.exit_code == 137


@pytest.mark.slow
def test_outside_a_rehearsal_cuda_calls_are_not_mapped(tmp_path):
    proc = start(tmp_path, """
        import torch
        torch.cuda.set_device(0)
    """, {"ACCELKIT_PROBES": WATCH, "ACCELKIT_WATCH_DIR": str(tmp_path / "watch")})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0 and "rehearsal on CPU" not in err


@pytest.mark.slow
def test_known_failure_is_left_for_the_launcher_to_report_once(tmp_path):
    watch = tmp_path / "watch"
    proc = start(tmp_path, """
        import torch
        x = torch.ones(2, device="cuda")
    """, {"ACCELKIT_REHEARSAL": "ddp", "CUDA_VISIBLE_DEVICES": "", "ACCELKIT_PROBES": WATCH,
          "ACCELKIT_WATCH_DIR": str(watch)})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in err and "Error:" not in err  # the rank stays quiet; the launcher prints it
    text = RankFiles.of(watch, proc.pid).error.read_text()
    assert "user_script.py:3" in text and "needs a CUDA device" in text


def test_stack_dump_waits_for_slow_writers(tmp_path):
    # A rank that registered but never answers the signal (it blocks it) is left out after the timeout.
    watch = tmp_path / "watch"
    proc = start(tmp_path, """
        import signal, time
        from accelkit.ranks.rank_files import STACK_SIGNAL
        signal.pthread_sigmask(signal.SIG_BLOCK, [STACK_SIGNAL])
        print("BLOCKED", flush=True)
        time.sleep(60)
    """, {"ACCELKIT_PROBES": WATCH, "ACCELKIT_WATCH_DIR": str(watch)})
    try:
        assert proc.stdout.readline().strip() == "BLOCKED"
        started = time.monotonic()
        assert RankMonitor(watch).dump_stacks(registered_ranks(watch), timeout=1.0) == []
        assert time.monotonic() - started < 5
    finally:
        proc.kill()
        proc.communicate()
