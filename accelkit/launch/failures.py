"""What the launcher says when a job does not run to the end: a rank that exited with an error or died of a signal,
a machine that waits for machine 0, a rendezvous that timed out. No torch here (the messages are plain text)."""

from __future__ import annotations

import signal
from pathlib import Path

from accelkit.errors import AccelkitError
from accelkit.launch.stacks import main_thread_stack
from accelkit.ranks import RankFiles, read_text

# Why a rank usually dies of each signal, and what to do about it.
_SIGNAL_HINTS = {
    "SIGSEGV": "a crash inside native code (torch, a compiled extension), not a Python error; the stack above shows "
               "the Python line that called into it",
    "SIGBUS": "often shared memory (/dev/shm) too small for DataLoader workers: use num_workers=0 or a larger "
              "/dev/shm (docker --shm-size)",
    "SIGABRT": "a native library aborted (a failed C++ check); its message is printed above the stack",
    "SIGKILL": "killed from outside, most often by the kernel's out-of-memory killer (check `dmesg`); lower the "
               "batch size or the number of processes, or shard more (FSDP, ZeRO-3)",
    "SIGFPE": "an arithmetic fault in native code (e.g. an integer division by zero)",
    "SIGILL": "an instruction this CPU lacks: a library built for a newer CPU",
}
_DEFAULT_SIGNAL_HINT = "the rank was stopped by a signal it did not handle; see the rank's output above"
DEFAULT_RENDEZVOUS_TIMEOUT = 900  # seconds: torchrun's default for the static rendezvous every launch uses


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def crash_location(watch_dir: Path | None, pid: int, rank: int) -> tuple[str | None, list[str]]:
    """(one-line location, the rank's main-thread stack as lines) from the dump faulthandler wrote when the rank
    died; (None, []) when there is none (no watch probe, or not a fatal signal faulthandler handles)."""
    if watch_dir is None:
        return None, []
    text = read_text(RankFiles.of(watch_dir, pid).crash)
    if not text.strip():
        return None, []
    # faulthandler marks the crashing thread "Current thread"; fall back to the first thread listed.
    ident = next((int(line.split()[2], 16) for line in text.splitlines() if line.startswith("Current thread ")), 0)
    stack = main_thread_stack(rank, pid, ident, text)
    if stack is None or not stack.frames:
        return None, []
    innermost = stack.frames[-1]
    where = stack.where()
    if stack.user_frame is not None and stack.user_frame != innermost:
        where += f" (inside {innermost.short()})"
    lines = [f'  File "{f.file}", line {f.line}, in {f.function}' for f in stack.frames]
    return where, lines


def rank_died(rank: int, pid: int, signum: int, watch_dir: Path | None) -> tuple[list[str], AccelkitError]:
    """The stack lines to print and the one-line error for a rank killed by signal `signum`."""
    name = signal_name(signum)
    where, stack_lines = crash_location(watch_dir, pid, rank)
    lines = []
    if stack_lines:
        lines = [f"accelkit: rank {rank} (pid {pid}) Python stack when it died, most recent call last:", *stack_lines]
    at = f" at {where}" if where else ""
    who = f"rank {rank} (pid {pid})" if pid else f"rank {rank}"
    error = AccelkitError(f"{who} died of {name}{at}; the launcher stopped the other ranks",
                          hint=_SIGNAL_HINTS.get(name, _DEFAULT_SIGNAL_HINT), exit_code=128 + signum)
    return lines, error


def rendezvous_timeout(timeout: int | None) -> int:
    return DEFAULT_RENDEZVOUS_TIMEOUT if timeout is None else timeout


def waiting_for_machine_zero(address: str, port: int, timeout: int) -> str:
    return f"accelkit: waiting for machine 0 at {address}:{port} (timeout {timeout} s)"


def machine_zero_unreachable(address: str, port: int, timeout: int, machine_rank: int) -> AccelkitError:
    return AccelkitError(
        f"machine {machine_rank} waited {timeout} s for machine 0 at {address}:{port}, which never answered",
        hint=f"start the same command on machine 0 with --machine-rank 0; check that {address} is machine 0's "
             f"address as seen from here, that port {port} is open between the machines (firewall), and that both "
             "use the same --main-process-port")


def waiting_for_other_machines(port: int, machines: int, timeout: int) -> str:
    return f"accelkit: machine 0 waiting for {machines - 1} other machine(s) on port {port} (timeout {timeout} s)"


def other_machines_missing(port: int, machines: int, timeout: int) -> AccelkitError:
    return AccelkitError(
        f"machine 0 waited {timeout} s on port {port} and not every one of the {machines - 1} other machine(s) "
        "joined",
        hint="start the same command on every machine with its own --machine-rank (1..N-1) and --main-process-ip "
             "set to this machine's address; check that the port is open to them (firewall)")
