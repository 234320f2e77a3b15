"""`accelkit launch`: resolve, run and supervise distributed jobs through Accelerate's launcher.

Modules, in the order a launch uses them:
- request.py  LaunchRequest: what the user asked for (crosses into the launcher process as JSON);
- prepare.py  build the config (accelkit.configs), decide CPU rehearsal (accelkit.rehearsal), check script, GPUs
              and DeepSpeed, write the config, then plan;
- plan.py     the pure function from config + target + flags to the exact launcher argv and environment;
- summary.py  which value came from where, for the user;
- worker.py   the launcher process: prepare, print, then run accelerate_main in-process;
- accelerate_main.py  `accelerate launch` with the failing rank's exit status;
- run.py      the supervisor in the `accelkit` process: signals, no orphans, exit status;
- slurm.py    the sbatch script; ports.py  a free port for single-machine jobs.
"""

from accelkit.launch.plan import LauncherFlags, LaunchPlan, LaunchTarget, plan_launch
from accelkit.launch.request import LaunchRequest

__all__ = ["LaunchPlan", "LaunchRequest", "LaunchTarget", "LauncherFlags", "plan_launch"]
