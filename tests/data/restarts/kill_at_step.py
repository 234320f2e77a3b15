"""Run a training script (argv[1:]) with one rank killed by a signal at an optimizer step, on the first attempt
only: KILL_RANK (global rank), KILL_STEP (the optimizer step after which it dies), KILL_SIGNAL (default SIGKILL).
A restarted group (TORCHELASTIC_RESTART_COUNT > 0) or a requeued job (SLURM_RESTART_COUNT > 0) runs untouched."""

import os
import runpy
import signal
import sys

first_attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0" and \
    os.environ.get("SLURM_RESTART_COUNT", "0") == "0"
if first_attempt and os.environ.get("RANK", "0") == os.environ.get("KILL_RANK", "1"):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    steps = [0]
    at = int(os.environ.get("KILL_STEP", "25"))
    signum = getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL"))

    def count(optimizer, args, kwargs):
        steps[0] += 1
        if steps[0] == at:
            os.kill(os.getpid(), signum)

    register_optimizer_step_post_hook(count)

sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
