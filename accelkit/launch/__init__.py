"""`accelkit launch`: plan, run and supervise distributed jobs through Accelerate's launcher.

The public surface (what the rest of accelkit imports; the modules below are this package's own):
- LaunchRequest, LaunchTarget, LauncherFlags: what to launch; prepare_launch / check_target: resolve and check it;
  LaunchPlan, plan_launch: the typed plan; dry_run_text: the plan as `--dry-run` prints it;
- run_launch(request, dry_run=, cluster=ClusterJobFile, ray=) -> CommandResult: `accelkit launch` as one call
  (api.py): run it, print it, write it as a cluster job, or run it on a Ray cluster (raytrain/);
- run_supervised(SupervisedRun) -> RunOutcome: THE way to run a job (a launch, or one plain ScriptProcess) under
  supervision: environment, probes, stall timeout, deadline and output files as parameters; status, exit code,
  stacks and the first failing rank's own error back (supervised.py); run_request: `accelkit launch`'s run;
- SlurmOptions, write_slurm_job / SkyPilotOptions, write_skypilot_task / KubernetesOptions, write_trainjob:
  the cluster targets (cluster/targets/: one typed cluster job, one renderer per scheduler).

Modules, in the order a launch uses them:
- api.py      run_launch: the command's one entry point (run, --dry-run, or a job file for --slurm/--skypilot/...);
- request.py  LaunchRequest: what the user asked for (crosses into the launcher process as JSON);
- preflight.py  checks made once in the `accelkit` process before any rank exists (the script's syntax, ...);
- build_plan.py  resolve the config (accelkit.configs), decide CPU rehearsal (accelkit.rehearsal), check script, GPUs,
              DeepSpeed and the rendezvous port, write the config, then plan;
- cpu_capacity.py  how many CPU ranks this machine can hold;
- build_locks.py  DeepSpeed op build locks left by interrupted builds, found and removed;
- collective_debug.py  the debug settings that make a hung GPU collective explain itself;
- launch_plan.py  LaunchPlan: the launcher module, its flags, the bootstrap, the port, the environment and the script
              argv as fields (argv derived), made by a pure function;
- summary.py  which value came from where, for the user (read from the config's sources and the plan's fields);
- worker.py   the launcher process: prepare, print, then run accelerate_main in-process;
- accelerate_main.py  `accelerate launch` with the failing rank's exit status;
- launch_dir.py  the one temporary folder a launch owns, removed on every way out;
- supervisor.py  the Supervisor in the `accelkit` process: signals, no orphans, stall watchdog, deadline, exit status;
- preemption.py  the first SIGTERM as a preemption: the ranks that catch SIGUSR1 save and stop, exit 143;
- inherited.py  launch-decided settings ($ACCELKIT_PIPELINE, ...) inherited from the shell are dropped, said;
- rank_monitor.py  the supervisor's view of this machine's ranks (who, how much they compute and write);
- watchdog.py  when a job is stalled: a pure decision over the monitor's samples;
- stacks.py   the ranks' dumped Python stacks, and where the job hangs;
- failures.py  what the launcher says when a rank exits with an error or dies of a signal;
- restarts.py  restarts said out loud (`--max-restarts`): which rank, how, the attempt, the checkpoint resumed;
- supervised.py  the supervised-run API on top of it (request in, outcome out);
- zero_resume.py  a DeepSpeed ZeRO checkpoint of another world size: read before any rank starts, converted once to
              DeepSpeed's universal format beside it (ds_to_universal), loaded with load_universal;
- cluster/    the cluster side: the node launcher every job file runs, SLURM's batch step, the job board, the
              cross-node preflight, network and heartbeats, and the job files (cluster/targets/);
- raytrain/   `--ray ADDRESS`: the job on the workers of a Ray Train run (one worker per rank);
- ports.py    free and busy ports.

Importing this package is cheap: its names load on first use (no torch, no psutil until then).
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "LaunchTarget": "launch_plan",
    "LauncherFlags": "launch_plan",
    "LaunchRequest": "request",
    "check_target": "build_plan",
    "prepare_launch": "build_plan",
    "run_launch": "api",
    "ClusterJobFile": "api",
    "RunOutcome": "supervised",
    "ScriptProcess": "supervised",
    "Stream": "supervised",
    "SupervisedRun": "supervised",
    "run_supervised": "supervised",
})
