"""`accelkit launch`: plan, run and supervise distributed jobs through Accelerate's launcher.

Modules, in the order a launch uses them:
- request.py  LaunchRequest: what the user asked for (crosses into the launcher process as JSON);
- prepare.py  resolve the config (accelkit.configs), decide CPU rehearsal (accelkit.rehearsal), check script, GPUs,
              DeepSpeed and the rendezvous port, write the config, then plan;
- plan.py     LaunchPlan: the launcher module, its flags, the bootstrap, the port, the environment and the script
              argv as fields (argv derived), made by a pure function;
- summary.py  which value came from where, for the user (read from the config's sources and the plan's fields);
- worker.py   the launcher process: prepare, print, then run accelerate_main in-process;
- accelerate_main.py  `accelerate launch` with the failing rank's exit status;
- run.py      the supervisor in the `accelkit` process: signals, no orphans, exit status;
- slurm.py    the sbatch script, from a plan without per-machine values; ports.py  free and busy ports.
"""

from accelkit.launch.plan import LauncherFlags, LaunchPlan, LaunchTarget, plan_launch
from accelkit.launch.request import LaunchRequest

__all__ = ["LaunchPlan", "LaunchRequest", "LaunchTarget", "LauncherFlags", "plan_launch"]
