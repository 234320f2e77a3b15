"""Run a training script (argv[1:]) whose Ray Train worker is SIGKILLed at an optimizer step, once: KILL_RANK (global
rank), KILL_STEP (the optimizer step after which its worker dies), KILL_MARKER (a file created at the kill; when it
exists, as in the group Ray restarts, the script runs untouched). The rank is the worker's child process
(accelkit.launch.raytrain.rank_process), so its parent is the Ray worker; the rank follows it (PR_SET_PDEATHSIG)."""

import os
import runpy
import signal
import sys
from pathlib import Path

marker = Path(os.environ["KILL_MARKER"])
if not marker.exists() and os.environ.get("RANK", "0") == os.environ.get("KILL_RANK", "1"):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps = [0]
    at = int(os.environ.get("KILL_STEP", "6"))

    def count(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == at:
            marker.write_text(f"killed the Ray worker {os.getppid()} of rank {os.environ['RANK']} at step {at}\n")
            os.kill(os.getppid(), signal.SIGKILL)
            signal.pause()  # until the worker's death takes this process too

    register_optimizer_step_post_hook(count)

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
