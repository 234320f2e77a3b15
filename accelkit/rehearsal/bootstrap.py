"""Rank entry point: install the CPU rehearsal shim and any probes, then run the user's script unmodified.

    accelerate launch --config_file cfg.yaml -m accelkit.rehearsal.bootstrap SCRIPT [ARGS...]
    accelerate launch --config_file cfg.yaml -m accelkit.rehearsal.bootstrap -m MODULE [ARGS...]

The rehearsed backend comes from $ACCELKIT_REHEARSAL (set by `prepare_rehearsal`; absent on GPUs). Probes are
per-rank instruments (bench's step timer, plan's byte counter) named in $ACCELKIT_PROBES as a comma-separated
list of modules; each module's `install()` runs before the script, on CPU rehearsals and on GPUs alike. The
script sees the same sys.argv and sys.path[0] as under `python SCRIPT ARGS`; its exit codes pass through untouched,
and so do its exceptions, except the few accelkit.rehearsal.explain recognises (a 0-dim parameter under FSDP or
DeepSpeed, a hard-coded CUDA tensor in a rehearsal, ...): those end the rank with one `Error:` line naming the cause
and the way out (ACCELKIT_DEBUG=1 shows the traceback instead). Under `accelkit launch` the rank leaves that line
to the launcher, which prints it once for the whole job.
"""

from __future__ import annotations

import atexit
import importlib
import os
import runpy
import sys
import time
from pathlib import Path

from accelkit.errors import AccelkitError, debug_enabled, report
from accelkit.rehearsal.rank_files import WATCH_DIR_ENV, RankFiles, write_error
from accelkit.rehearsal.shim import REHEARSAL_ENV, install

PROBES_ENV = "ACCELKIT_PROBES"
USAGE = "usage: python -m accelkit.rehearsal.bootstrap SCRIPT [ARGS...] | -m MODULE [ARGS...]"


def _fail(error: AccelkitError) -> int:
    watch_dir = os.environ.get(WATCH_DIR_ENV)
    if watch_dir:  # the launcher reports it once, for the rank that failed first
        try:
            write_error(RankFiles.of(Path(watch_dir), os.getpid()), error.message, error.hint)
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
            f"accelkit.rehearsal.bootstrap runs only inside an accelkit launch (${REHEARSAL_ENV} and "
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


def _settle_process_group() -> None:
    """torch 2.13 + gloo: a gloo worker thread that drops its last work item while the interpreter is shutting down
    aborts the process ("terminate called without an active exception", exit 134; seen at the end of about one DDP
    run in eight on a loaded machine). Give those threads a moment while Python is still fully alive."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        time.sleep(0.3)


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except KeyboardInterrupt:  # Ctrl-C reached every rank: the launcher says so once, not N tracebacks
        if debug_enabled():
            raise
        return 130


def _run(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(USAGE, file=sys.stderr)
        return 2
    atexit.register(_settle_process_group)  # registered first, so it runs after the script's own exit handlers
    try:
        _install_from_env()
    except AccelkitError as error:
        return _fail(error)

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
    except AccelkitError as error:  # raised by the shim when the script imports Accelerate
        return _fail(error)
    except Exception as exc:  # the script's own failure: explained when it is one we know, else untouched
        from accelkit.rehearsal.explain import explain

        error = None if debug_enabled() else explain(exc)
        if error is None:
            raise
        return _fail(error)


if __name__ == "__main__":
    sys.exit(main())
