"""`python -m accelkit.launch.accelerate_main ARGS` = `accelerate launch ARGS`, with a useful exit status.

Accelerate's own launch command turns every rank failure into exit status 1 and a long torch.distributed
traceback. This entry point runs exactly the same parser and launch function, then exits with the status of the
rank that failed first (128 + N when it was killed by signal N), printing one line naming it instead.
"""

from __future__ import annotations

import subprocess
import sys


def exit_status(returncode: int) -> int:
    """A shell-style exit status: 128 + N for a process killed by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def main(argv: list[str] | None = None) -> int:
    from accelerate.commands.launch import launch_command, launch_command_parser
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    args = launch_command_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        launch_command(args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        status = exit_status(failure.exitcode) or 1
        print(f"accelkit: rank {rank} (pid {failure.pid}) failed first, exit code {failure.exitcode}; "
              "the launcher stopped the other ranks.", file=sys.stderr, flush=True)
        return status
    except SignalException as exc:
        print(f"accelkit: launcher received signal {int(exc.sigval)}; ranks stopped.", file=sys.stderr, flush=True)
        return 128 + int(exc.sigval)
    except subprocess.CalledProcessError as exc:  # single-process and pdsh-style launchers
        return exit_status(exc.returncode) or 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
