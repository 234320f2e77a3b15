"""The one place `convert --check` touches the launch spine: the converted script on N CPU ranks (a DDP rehearsal,
what `accelkit launch --cpu --backend ddp --num-processes N` runs) with the check probe in every rank.

    python -m accelkit.convert.check.launcher '{"script": ..., "args": [...], "processes": 2}'

It runs in a process of its own, so the checking side can watch it (stall dumps, time limit) and stop it with one
signal: the launch supervisor then stops every rank and cleans up. (Not imported by the rest of the package:
`python -m` runs it as a fresh module.)
"""

from __future__ import annotations

import json
import signal
import sys

from accelkit.convert.check.record import PROBE_MODULE


def main(argv: list[str] | None = None) -> int:
    from accelkit.configs import ConfigOptions
    from accelkit.launch.plan import LaunchTarget
    from accelkit.launch.request import LaunchRequest
    from accelkit.launch.run import _PR_SET_PDEATHSIG, _prctl, run_request

    _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)  # the checking process died: stop (the supervisor stops the ranks)
    spec = json.loads((sys.argv[1:] if argv is None else argv)[0])
    request = LaunchRequest(target=LaunchTarget(spec["script"], tuple(spec["args"])), cpu=True,
                            options=ConfigOptions(backend="ddp", num_processes=spec["processes"]),
                            probes=(PROBE_MODULE,), command_line="accelkit convert --check")
    return run_request(request)


if __name__ == "__main__":
    sys.exit(main())
