"""Rank entry point: install the CPU rehearsal shim and any probes, then run the user's script unmodified.

    accelerate launch --config_file cfg.yaml -m accelkit.ranks.bootstrap SCRIPT [ARGS...]
    accelerate launch --config_file cfg.yaml -m accelkit.ranks.bootstrap -m MODULE [ARGS...]

The rehearsed backend comes from $ACCELKIT_REHEARSAL (set by `rehearse`'s plan; absent on GPUs). Probes are
per-rank instruments (bench's step timer, plan's byte counter) named in $ACCELKIT_PROBES as a comma-separated
list of modules; each module's `install()` runs before the script, on CPU rehearsals and on GPUs alike. The
script sees the same sys.argv and sys.path[0] as under `python SCRIPT ARGS`; its exit codes pass through untouched,
and so do its exceptions, except the few accelkit.ranks.explain recognises (a 0-dim parameter under FSDP or
DeepSpeed, a hard-coded CUDA tensor in a rehearsal, ...): those end the rank with one `Error:` line naming the cause
and the way out (ACCELKIT_DEBUG=1 shows the traceback instead). Under `accelkit launch` the rank leaves that line
to the launcher, which prints it once for the whole job.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import os
import runpy
import sys
import threading
import time
from pathlib import Path

from accelkit.errors import AccelkitError, clip, debug_enabled, report
from accelkit.ranks.rank_files import WATCH_DIR_ENV, RankFailure, RankFiles, write_failure, write_rank_error
from accelkit.ranks.rank_output import whole_lines
from accelkit.rehearsal import REHEARSAL_ENV, install

PROBES_ENV = "ACCELKIT_PROBES"
USAGE = "usage: python -m accelkit.ranks.bootstrap SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def _record_failure(error: str, exit_code: int) -> None:
    """Under a supervisor: leave when and how this rank failed, so the rank that failed first is named with its
    own error (accelkit.launch's outcome), not a peer that failed because of it."""
    watch_dir = os.environ.get(WATCH_DIR_ENV)
    if not watch_dir:
        return
    failure = RankFailure(rank=int(os.environ.get("RANK", "0")), pid=os.getpid(), error=clip(error, 500),
                          exit_code=exit_code, time=time.time())
    with contextlib.suppress(OSError):
        write_failure(RankFiles.of(Path(watch_dir), os.getpid()), failure)


_usage_error: list[str] = []  # the message of the script's argparse error, which exits with status 2


def _remember_usage_errors() -> None:
    """argparse prints its error and exits 2: keep the message (the call itself is unchanged)."""
    import argparse

    original = argparse.ArgumentParser.error

    def error(self, message):
        _usage_error[:] = [f"{self.prog}: error: {message}"]
        original(self, message)

    argparse.ArgumentParser.error = error


def _fail(error: AccelkitError) -> int:
    _record_failure(error.message, error.exit_code)
    watch_dir = os.environ.get(WATCH_DIR_ENV)
    if watch_dir:  # the launcher reports it once, for the rank that failed first
        try:
            write_rank_error(RankFiles.of(Path(watch_dir), os.getpid()), error.message, error.hint)
            return error.exit_code
        except OSError:
            pass
    # Without a launcher to tell: every rank fails the same way, and one message is enough.
    if os.environ.get("RANK", "0") == "0":
        report(error)
    return error.exit_code


def _install_from_env() -> None:
    backend = os.environ.get(REHEARSAL_ENV)
    probes = [name.strip() for name in os.environ.get(PROBES_ENV, "").split(",") if name.strip()]
    if not backend and not probes:
        raise AccelkitError(
            f"accelkit.ranks.bootstrap runs only inside an accelkit launch (${REHEARSAL_ENV} and "
            f"${PROBES_ENV} are not set).",
            hint="start the script with `accelkit launch --cpu ...` (a rehearsal) or `accelkit launch ...`",
        )
    if backend == "deepspeed":
        # Accelerate never enables DeepSpeed when cpu=True; the shim makes cpu=False pick gloo instead.
        os.environ.pop("ACCELERATE_USE_CPU", None)
    if backend:
        install(backend)
    for name in probes:
        importlib.import_module(name).install()


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:  # Ctrl-C reached every rank: the launcher says so once, not N tracebacks
        if debug_enabled():
            raise
        return 130


def _run(argv: list[str] | None) -> int:
    whole_lines()  # torchrun's `python -u` would let two ranks' lines glue together
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        _install_from_env()
    except AccelkitError as error:
        return _fail(error)

    if os.environ.get(WATCH_DIR_ENV):
        _remember_usage_errors()
    try:
        if argv[0] == "-m":
            module, args = argv[1], argv[2:]
            sys.argv = [module, *args]  # runpy replaces argv[0] with the module's file, as `python -m` does
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            return 0
        script, args = argv[0], argv[1:]
        if not os.path.exists(script):
            print(f"python: can't open file {script!r}: [Errno 2] No such file or directory", file=sys.stderr)
            return 2
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))
        runpy.run_path(script, run_name="__main__")
        return 0
    except SystemExit as stop:  # the script's own sys.exit(): its status, then the same way out as a return
        status = _exit_status(stop)
        if status != 0:
            _record_failure(_usage_error[0] if status == 2 and _usage_error else _exit_message(stop, status), status)
        return status
    except AccelkitError as error:  # raised by the shim when the script imports Accelerate
        return _fail(error)
    except Exception as exc:  # the script's own failure: explained when it is one we know, else untouched
        from accelkit.ranks.explain import explain

        error = None if debug_enabled() else explain(exc)
        if error is None:
            _record_failure(f"{type(exc).__name__}: {exc}", 1)
            raise
        return _fail(error)


def end_rank(status: int) -> None:
    """Leave the rank as a normal exit would (the script's exit handlers run, logging and output flushed), but
    without the interpreter's teardown, where torch 2.13's gloo threads now and then abort a rank whose job has
    succeeded ("terminate called without an active exception", then SIGABRT or SIGBUS, even after
    destroy_process_group: about one DDP run in eight on a loaded machine). A script that leaves non-daemon threads
    running gets the normal exit, which waits for them."""
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def _exit_message(stop: SystemExit, status: int) -> str:
    if isinstance(stop.code, str):
        return stop.code
    return f"the script exited with status {status} (sys.exit)"


def _exit_status(stop: SystemExit) -> int:
    """The status `python SCRIPT` exits with after `sys.exit(code)` (a message is printed, status 1)."""
    if stop.code is None:
        return 0
    if isinstance(stop.code, int):
        return stop.code
    print(stop.code, file=sys.stderr)
    return 1


if __name__ == "__main__":
    end_rank(main())
