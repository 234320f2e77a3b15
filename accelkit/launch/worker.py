"""The launcher process of `accelkit launch`: `python -m accelkit.launch.worker REQUEST_JSON`.

The `accelkit` process stays light (click only) and supervises; this process resolves the config (which needs
torch and Accelerate), prints what it uses, and then runs the planned launcher command in-process: the plan's argv
is `python -m accelkit.launch.accelerate_main ARGS`, and this calls that module's main(ARGS) with the plan's
environment, so torch is imported once instead of twice before the first rank starts.
"""

from __future__ import annotations

import os
import shutil
import sys

from accelkit.errors import AccelkitError, debug_enabled, report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    from accelkit.launch.plan import LAUNCHER_MODULE
    from accelkit.launch.request import LaunchRequest

    request = LaunchRequest.from_json(argv[0])
    temp_dir = None
    try:
        from accelkit.launch.prepare import prepare_launch

        prepared = prepare_launch(request)
        temp_dir = prepared.temp_dir
        for line in prepared.summary:
            print(line, file=sys.stderr, flush=True)
        plan = prepared.plan
        os.environ.update(plan.env)
        from accelkit.launch import accelerate_main

        launcher_args = plan.argv[plan.argv.index(LAUNCHER_MODULE) + 1:]
        return accelerate_main.main(launcher_args)
    except AccelkitError as error:  # before any rank started: one message, like the CLI prints it
        if debug_enabled():
            raise
        return report(error)
    except KeyboardInterrupt:
        return 130
    finally:
        if temp_dir is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
