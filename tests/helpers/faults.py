"""The fault-test harness: run one accelkit command on a bad input (or with a signal, or a crash) and observe
everything a careful user would check afterwards.

    result = run_fault(["merge-ckpt", str(src), "-o", str(out)], watch=[tmp_path])
    result.assert_refused("shards come from different runs")

`run_fault` snapshots the watched trees (every file's sha256, every folder) before and after, looks for temporary
files accelkit left in the watched trees and in the temp folder the command is given (a fresh $TMPDIR per run, so
other processes on a shared machine are never counted), and for processes the command started that outlived it.
`assert_refused` then checks the contract of every failure: a non-zero exit (1 unless told), exactly one `Error:`
line that matches, a `Hint:` (or, for click's usage errors, `hint=False`: click prints its usage line instead), no
traceback, nothing created, changed or deleted outside `owned` paths, no leftovers, no orphans.

`invoke_fault` observes the same way, and checks the same contract, for a command run in this process through
the console entry point (`accelkit.cli.main`): for refusals that come before anything runs (argument checks, usage
errors, outputs that cannot be written), where a Python and torch start-up per case would be most of the test.
Signals, namespaces (read-only or full file systems), commands that start processes (launch's worker) and the real
console script are what `run_fault` is for. tests/faults/test_fault_harness.py runs one case of each file that uses
`invoke_fault` both ways and compares the observations (slow; `record=False`, so that the fault catalogue counts
each case once).

When $ACCELKIT_FAULT_RECORD names a file, every observation is appended to it as one JSON line; that is how
benchmarks/faults.py turns the fault suite into its table (inputs tried, refused with a clear message, tracebacks,
silent wrong outputs, leftovers, orphans).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

RECORD_ENV = "ACCELKIT_FAULT_RECORD"
TEMP_PATTERNS = (re.compile(r"\.accelkit-tmp-\d+$"), re.compile(r"\.accelkit-old-\d+$"),
                 re.compile(r"^accelkit-launch-"), re.compile(r"^accelkit-check-"))


def snapshot(root: Path) -> dict[str, str]:
    """Every path under root: files map to their sha256, folders and links to a marker."""
    import hashlib

    root = Path(root)
    if not root.exists():
        return {}
    entries = [root, *sorted(root.rglob("*"))] if root.is_dir() else [root]
    out: dict[str, str] = {}
    for path in entries:
        key = str(path)
        if path.is_symlink():
            out[key] = "link:" + os.readlink(path)
        elif path.is_dir():
            out[key] = "dir"
        elif path.is_file():
            out[key] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:  # a FIFO, socket or device: its kind (replacing one by a regular file is a change)
            out[key] = f"special:{stat.S_IFMT(path.lstat().st_mode):o}"
    return out


def _temp_leftovers(roots: list[Path], private_tmp: Path) -> list[str]:
    """Temporary files accelkit left in the watched trees, and in the temp folder the command was given (a private
    one, so that other processes on the machine are never mistaken for this command)."""
    found = []
    for root in roots:
        if not root.exists():
            continue
        for path in [root, *root.rglob("*")] if root.is_dir() else [root]:
            if any(p.search(path.name) for p in TEMP_PATTERNS):
                found.append(str(path))
    for path in private_tmp.iterdir():
        if any(p.search(path.name) for p in TEMP_PATTERNS):
            found.append(str(path))
    return found


def _script_traceback(block: str) -> bool:
    frames = []
    for line in block.splitlines()[1:]:
        line = re.sub(r"^\[rank\d+\]:", "", line)  # torchrun's prefix on a rank's error output
        if not line.startswith(" "):
            break  # the exception line ends the frames
        match = re.match(r'\s+File "([^"]+)"', line)
        if match:
            frames.append(match.group(1))
    stdlib = os.path.dirname(os.__file__)
    return any("/accelkit/" not in path and "site-packages" not in path and not path.startswith(stdlib)
               and not path.startswith("<") for path in frames)


def _orphans(marker: str) -> list[str]:
    """Processes still alive whose environment carries this run's marker (set on the command we started)."""
    alive = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid == os.getpid():
                continue
            if proc.environ().get("ACCELKIT_FAULT_MARKER") == marker:
                alive.append(f"{proc.pid}: {' '.join(proc.info['cmdline'] or [])[:200]}")
        except (psutil.Error, OSError):
            continue
    return alive


@dataclass
class FaultResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    created: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def traceback(self) -> bool:
        """A Python traceback of accelkit's own. The traceback of the user's script (one with a frame in a file
        outside accelkit, site-packages and the standard library), shown as `python SCRIPT` shows it, is not."""
        text = self.stderr + self.stdout
        return any(not _script_traceback(block) for block in text.split("Traceback (most recent call last)")[1:])

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.startswith("Error:")]

    def touched_outside(self, owned: list[Path] | tuple[Path, ...] = ()) -> list[str]:
        owned_strs = [str(Path(p)) for p in owned]

        def is_owned(path: str) -> bool:
            return any(path == o or path.startswith(o + os.sep) for o in owned_strs)

        return [p for p in self.created + self.changed + self.deleted if not is_owned(p)]

    def assert_refused(self, match: str | None = None, *, exit_code: int = 1,
                       owned: list[Path] | tuple[Path, ...] = (), hint: bool = True) -> str:
        """The failure contract: exit code, one matching `Error:` line and a `Hint:`, no traceback, nothing
        touched outside `owned`, no leftovers, no orphans. Returns the error line."""
        text = f"\n--- stdout\n{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}"
        assert self.returncode == exit_code, f"exit {self.returncode}, expected {exit_code}{text}"
        assert not self.traceback, f"traceback shown{text}"
        assert len(self.error_lines) == 1, f"expected one Error: line, got {self.error_lines}{text}"
        if match is not None:
            assert re.search(match, self.error_lines[0]), f"{match!r} not in {self.error_lines[0]!r}"
        if hint:
            assert "Hint:" in self.stderr, f"no Hint: line{text}"
        else:  # a click usage error: the usage line and `Try 'accelkit COMMAND -h' for help.` say what to do
            assert "Usage:" in self.stderr and "for help" in self.stderr, f"no usage line{text}"
        self.assert_clean(owned=owned)
        return self.error_lines[0]

    def assert_clean(self, owned: list[Path] | tuple[Path, ...] = ()) -> None:
        """Nothing touched outside `owned`, no temporary leftovers, no orphan processes."""
        touched = self.touched_outside(owned)
        assert not touched, f"created/changed/deleted outside what the command owns: {touched}"
        assert not self.leftovers, f"temporary files left behind: {self.leftovers}"
        assert not self.orphans, f"processes outlived the command: {self.orphans}"


def _compare(result: FaultResult, before: dict[str, dict[str, str]], watch: list[Path]) -> None:
    """What the command created, deleted and changed in the watched trees (`before`: their snapshots)."""
    for root in watch:
        old, new = before[str(root)], snapshot(root)
        result.created += sorted(set(new) - set(old))
        result.deleted += sorted(set(old) - set(new))
        result.changed += sorted(p for p in set(old) & set(new) if old[p] != new[p])


def _record(result: FaultResult, kind: str, expect: str) -> None:
    path = os.environ.get(RECORD_ENV)
    if not path:
        return
    row = {"kind": kind, "expect": expect, "test": os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0],
           **asdict(result), "traceback": result.traceback, "error_lines": result.error_lines}
    row["stdout"], row["stderr"] = row["stdout"][-2000:], row["stderr"][-2000:]
    # one write() on an O_APPEND file: rows from parallel test workers never interleave
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(row) + "\n").encode())
    finally:
        os.close(fd)


def run_fault(args: list[str], *, watch: list[Path], cwd: Path | None = None, env: dict[str, str] | None = None,
              timeout: float = 300,
              send_signal: tuple[float | str | Path, int] | list[tuple[float | str | Path, int]] | None = None,
              kind: str = "bad input",
              expect: str = "refused", preexec_fn=None, stdin: str | None = None,
              readonly: Path | None = None, small_fs: tuple[Path, int] | None = None,
              unprivileged: bool = False, record: bool = True) -> FaultResult:
    """Run `python -m accelkit ARGS` and observe it (see the module docstring).

    `send_signal=(when, signum)`: send signum to the command after `when` seconds, once a line containing `when` (a
    string) appears on its stderr or stdout, or once the file `when` (a Path) exists; a list of such pairs sends
    them in turn (seconds count from the previous signal). The temp folder checked for leftovers is the command's
    TMPDIR when `env` sets one (a private one keeps other jobs on the machine out of the check), else the system's.
    `expect` says what a correct tool does ("refused": a clean error; "signal": a clean stop; "ok": success) and is
    recorded for benchmarks/faults.py. `readonly`: an existing folder the command sees as a read-only file system (a
    private mount namespace: `unshare -rm`, then a read-only tmpfs over the folder), for every user, root included.
    `small_fs=(folder, bytes)`: the folder is an empty writable file system of that size (the same mechanism), to
    meet a full disk. `unprivileged`: the command runs in a new user namespace, where even root has no permission
    override: a file with mode 000 is unreadable.
    `record=False`: not appended to $ACCELKIT_FAULT_RECORD (a real-process twin of a case `invoke_fault` runs).
    """
    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    private_tmp = Path(tempfile.mkdtemp(prefix="fault-tmp-"))
    full_env = {**os.environ, "TMPDIR": str(private_tmp), **(env or {}), "ACCELKIT_FAULT_MARKER": marker}
    before = {str(root): snapshot(root) for root in watch}
    start = time.time()
    command = [sys.executable, "-m", "accelkit", *args]
    if readonly is not None or small_fs is not None:
        import shlex

        folder, options = (readonly, "ro,size=1m") if readonly is not None else (small_fs[0], f"size={small_fs[1]}")
        mount = f"mount -t tmpfs -o {options} tmpfs {shlex.quote(str(folder))}"
        command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                   f"{mount} && exec {shlex.join(command)}"]
    elif unprivileged:
        command = ["unshare", "--user", *command]
    proc = subprocess.Popen(command, cwd=cwd, env=full_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=_as_from_a_terminal(preexec_fn),
                            stdin=subprocess.PIPE if stdin is not None else None)
    if send_signal is None:
        stdout, stderr = proc.communicate(stdin, timeout=timeout)
    else:
        stdout, stderr = _communicate_with_signal(proc, send_signal, timeout)
    time.sleep(0.2)  # let killed children finish dying before looking for orphans
    result = FaultResult(args=list(args), returncode=proc.returncode, stdout=stdout, stderr=stderr,
                         seconds=time.time() - start)
    _compare(result, before, watch)
    command_tmp = Path(env["TMPDIR"]) if env and env.get("TMPDIR") else private_tmp
    result.leftovers = _temp_leftovers([Path(r) for r in watch], command_tmp)
    shutil.rmtree(private_tmp, ignore_errors=True)
    result.orphans = _orphans(marker)
    _kill(result.orphans)
    if record:
        _record(result, kind, expect)
    return result


def _kill(orphans: list[str]) -> None:
    for line in orphans:  # never let a test leak processes into the next one
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)


@contextlib.contextmanager
def _descriptors_captured():
    """Descriptors 1 and 2 point at files while the block runs: what a child process or native code writes there
    (which the Python-level capture of `invoke_accelkit` does not see) is in the yielded dict afterwards."""
    captured = {"stdout": "", "stderr": ""}
    sys.stdout.flush()
    sys.stderr.flush()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            yield captured
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            for name, file in (("stdout", out), ("stderr", err)):
                file.seek(0)
                captured[name] = file.read().decode(errors="replace")


def invoke_fault(args: list[str], *, watch: list[Path], cwd: Path | None = None, env: dict[str, str] | None = None,
                 kind: str = "bad input", expect: str = "refused", record: bool = True) -> FaultResult:
    """Run `accelkit ARGS` in this process (`helpers.invoke_accelkit`: the console entry point, its one-line errors
    and exit codes) and observe it as `run_fault` does: the watched trees before and after, temporary leftovers in
    them and in the command's own temp folder (a fresh one, given through $TMPDIR and `tempfile.tempdir`, unless
    `env` names one), processes it started that outlived it; recorded for benchmarks/faults.py alike. The process
    environment is put back as it was, whatever the command set. Only for variables read when the command runs:
    one a library reads at import (HF_HOME, for instance) needs `run_fault`."""
    from helpers import invoke_accelkit

    marker = f"{os.getpid()}-{time.monotonic_ns()}"
    private_tmp = Path(tempfile.mkdtemp(prefix="fault-tmp-"))
    full_env = {"TMPDIR": str(private_tmp), **(env or {}), "ACCELKIT_FAULT_MARKER": marker}
    command_tmp = Path(full_env["TMPDIR"])
    before = {str(root): snapshot(root) for root in watch}
    saved_environ, saved_tempdir = dict(os.environ), tempfile.tempdir
    start = time.time()
    with _descriptors_captured() as written:
        tempfile.tempdir = str(command_tmp)
        try:
            proc = invoke_accelkit(*args, cwd=cwd, env=full_env)
        finally:
            seconds = time.time() - start
            tempfile.tempdir = saved_tempdir
            for key in set(os.environ) - set(saved_environ):
                del os.environ[key]
            os.environ.update(saved_environ)
    result = FaultResult(args=list(args), returncode=proc.returncode, stdout=proc.stdout + written["stdout"],
                         stderr=proc.stderr + written["stderr"], seconds=seconds)
    _compare(result, before, watch)
    result.leftovers = _temp_leftovers([Path(r) for r in watch], command_tmp)
    shutil.rmtree(private_tmp, ignore_errors=True)
    result.orphans = _orphans(marker)
    if result.orphans:  # a child that is still dying is given the time run_fault gives it
        time.sleep(0.2)
        result.orphans = _orphans(marker)
    _kill(result.orphans)
    if record:
        _record(result, kind, expect)
    return result


def _as_from_a_terminal(preexec_fn):
    """The command starts with SIGINT at its default, as from a shell prompt, also when the tests themselves run
    as a background job (`cmd &` in a script starts with SIGINT ignored, and a Python started so never raises
    KeyboardInterrupt): Ctrl-C faults then test the command, not how the suite was started."""
    import signal

    def prepare() -> None:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        if preexec_fn is not None:
            preexec_fn()

    return prepare


def _communicate_with_signal(proc: subprocess.Popen,
                             send_signal: tuple[float | str | Path, int] | list[tuple[float | str | Path, int]],
                             timeout: float) -> tuple[str, str]:
    import threading

    plan = send_signal if isinstance(send_signal, list) else [send_signal]
    err_lines: list[str] = []
    out_lines: list[str] = []
    seen_text = threading.Condition()

    def reader(stream, lines: list[str]) -> None:
        for line in stream:
            with seen_text:
                lines.append(line)
                seen_text.notify_all()

    threads = [threading.Thread(target=reader, args=(proc.stderr, err_lines), daemon=True),
               threading.Thread(target=reader, args=(proc.stdout, out_lines), daemon=True)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for when, signum in plan:
        if isinstance(when, Path):  # a file the command creates, e.g. a lock taken while it builds
            while not when.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
        elif isinstance(when, str):
            with seen_text:
                seen_text.wait_for(lambda when=when: any(when in line for line in err_lines + out_lines)
                                   or proc.poll() is not None, timeout=max(0.0, deadline - time.monotonic()))
        else:
            time.sleep(when)
        if proc.poll() is None:
            proc.send_signal(signum)
    try:
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    for t in threads:
        t.join(timeout=10)
    return "".join(out_lines), "".join(err_lines)
