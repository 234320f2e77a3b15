"""The launcher process of `accelkit launch`: `python -m accelkit.launch.worker REQUEST_JSON`.

The `accelkit` process stays light (click only) and supervises; this process resolves the config (which needs
torch and Accelerate), prints what it uses, and then runs the planned launcher in-process: it calls
accelkit.launch.accelerate_main's main() with the plan's launcher arguments and environment, so torch is imported
once instead of twice before the first rank starts.

When the launcher has returned, its ranks are gone and its files removed; the process then ends with os._exit,
skipping the interpreter's teardown of torch and Accelerate (0.4-0.8 s measured on the build machine, a tenth of a
2-process hello-world), which nothing here needs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys

from accelkit.errors import AccelkitError, debug_enabled, report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest.from_json(argv[0])
    temp_dir = None
    try:
        from accelkit.configs import Backend
        from accelkit.launch.build_locks import clear_stale_build_locks
        from accelkit.launch.build_plan import prepare_launch

        prepared = prepare_launch(request)
        temp_dir = prepared.temp_dir
        for line in prepared.summary:
            print(line, file=sys.stderr, flush=True)
        plan = prepared.plan
        from accelkit.launch.inherited import drop_inherited_settings

        for line in drop_inherited_settings(os.environ, plan.env):
            print(line, file=sys.stderr, flush=True)
        os.environ.update(plan.env)
        if plan.config.backend is Backend.DEEPSPEED:  # a lock an interrupted op build left would hang every rank
            for line in clear_stale_build_locks(os.environ):
                print(line, file=sys.stderr, flush=True)
        from accelkit.launch import accelerate_main

        return accelerate_main.main(plan.launcher_args())
    except AccelkitError as error:  # before any rank started: one message, like the CLI prints it
        if debug_enabled():
            raise
        return report(error)
    except KeyboardInterrupt:
        return 130
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


def exit_now(code: int) -> None:
    """End the process with `code` once its output is flushed, without the interpreter's teardown."""
    import logging

    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe: nothing left to say
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())
