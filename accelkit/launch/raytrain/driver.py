"""`accelkit launch --ray ADDRESS`: resolve the launch, check the cluster, run one Ray Train worker per rank.

Ray Train's TorchTrainer owns the workers: placement (ScalingConfig), restarts of the whole group after a failure
(FailureConfig(max_failures) = --max-restarts) and the run's storage (RunConfig(storage_path) = --ray-storage). Each
worker starts its rank (rank_process.run_rank) with the environment Accelerate's launcher would give it, so
`Accelerator()` in the unmodified script forms its process group from what Ray set up (rank, world size, rank 0's
address). What accelkit does not hand to Ray: the stall watchdog and the heartbeats that name a lost machine
(Ray watches its own workers and names a lost node in its error), and machine-rank flags (Ray places the workers).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.launch.launch_plan import BOOTSTRAP_MODULE, LaunchPlan
from accelkit.launch.raytrain import readiness
from accelkit.launch.raytrain.job import RayJob, RayOptions, user_environment
from accelkit.launch.request import LaunchRequest

WATCHDOG_NOTE = ("stall watchdog and lost-machine heartbeats: not used under --ray (Ray Train watches its workers and "
                 "names a lost node; a hung collective ends at the process group's timeout)")


def rank_argv(plan: LaunchPlan) -> tuple[str, ...]:
    """What follows the Python interpreter in each rank (the bootstrap first when the plan uses it)."""
    target = plan.target
    inner = ["-m", target.script] if target.module else [target.script]
    prefix = ["-m", BOOTSTRAP_MODULE] if plan.bootstrap else []
    return (*prefix, *inner, *target.args)


def build_job(request: LaunchRequest, options: RayOptions, plan: LaunchPlan, cwd: Path) -> RayJob:
    from accelkit.launch.inherited import drop_inherited_settings
    from accelkit.launch.raytrain.rank_env import accelerate_rank_env

    users = user_environment(dict(os.environ))
    for line in drop_inherited_settings(users, plan.env):
        print(line, file=sys.stderr, flush=True)
    env = {**users, **accelerate_rank_env(plan), "PYTHONUNBUFFERED": "1"}
    config = plan.config
    script = None if plan.target.module else str((cwd / plan.target.script).resolve())
    return RayJob(address=options.address, num_workers=config.num_processes,
                  use_gpu=plan.rehearsal is None and not request.cpu, cpus_per_worker=options.cpus_per_worker,
                  max_failures=request.flags.max_restarts or 0,
                  storage=None if options.storage is None else str(options.storage.resolve()),
                  name=f"accelkit-{time.strftime('%Y%m%d-%H%M%S')}", rank_argv=rank_argv(plan), cwd=str(cwd),
                  env=env, script_path=script)


def describe(job: RayJob) -> list[str]:
    resources = ", ".join(f"{amount:g} {name}" for name, amount in job.resources_per_worker().items())
    storage = job.storage or "Ray's default (~/ray_results on the head node)"
    return [f"Ray Train job on {job.address}: {job.num_workers} workers x ({resources}), restarts up to "
            f"{job.max_failures} (FailureConfig(max_failures)), storage {storage}",
            f"each worker runs: python {' '.join(job.rank_argv)}  (in {job.cwd})",
            WATCHDOG_NOTE]


def run_ray_launch(request: LaunchRequest, *, address: str, storage: Path | None = None,
                   cpus_per_worker: int | None = None, dry_run: bool = False) -> CommandResult:
    """`request` on the Ray cluster at `address` (or, `dry_run`, what would run there)."""
    from accelkit.launch.build_plan import prepare_launch

    options = RayOptions(address=address, storage=storage,
                         **({} if cpus_per_worker is None else {"cpus_per_worker": cpus_per_worker}))

    _quiet_ray_logs()  # before the first `import ray` (finding ray.train imports it)
    readiness.check_ray_installed()
    if not dry_run:
        readiness.check_address_reachable(options.address)
    cwd = Path.cwd()
    prepared = prepare_launch(replace(request, for_cluster=True), check_hardware=False)
    try:
        job = build_job(request, options, prepared.plan, cwd)
        # The launch summary speaks of ranks on this machine; here they run on the Ray workers.
        summary = [line.replace(" on this machine", " on the Ray workers") for line in prepared.summary]
        lines = [*summary, *describe(job)]
        if dry_run:
            accelerate_env = {name: value for name, value in job.env.items() if name.startswith(("ACCELERATE_",
                              "ACCELKIT_", "FSDP_"))}
            env_lines = [f"  {name}={value}" for name, value in sorted(accelerate_env.items())]
            return CommandResult().out("\n".join([*lines, "environment each rank gets (beside the user's):",
                                                 *env_lines]))
        for line in lines:
            print(line, file=sys.stderr, flush=True)
        return CommandResult(exit_code=_run(job, cwd))
    finally:
        if prepared.temp_dir is not None:
            import shutil

            shutil.rmtree(prepared.temp_dir, ignore_errors=True)


def _quiet_ray_logs() -> None:
    """Ray reads these when imported: every rank's lines as they are (not "[repeated 3x across cluster]"), and no
    colour codes in a log file."""
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    if not sys.stderr.isatty():
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _run(job: RayJob, cwd: Path) -> int:
    import logging

    import ray

    try:
        ray.init(address=job.address, logging_level=logging.WARNING, log_to_driver=True)
    except (ConnectionError, RuntimeError) as exc:
        raise AccelkitError(f"cannot connect to the Ray cluster at {job.address}: {str(exc).splitlines()[0]}",
                            hint="start it (`ray start --head`) or pass the address `ray status` shows") from None
    try:
        _check_cluster(job, cwd)
        return _fit(job)
    finally:
        ray.shutdown()


def _check_cluster(job: RayJob, cwd: Path) -> None:
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [node for node in ray.nodes() if node.get("Alive")]
    readiness.check_resources(job, ray.cluster_resources(), [node.get("Resources", {}) for node in nodes])
    with readiness.storage_probe(cwd) as probe:
        describe_node = ray.remote(num_cpus=0)(readiness.describe_node)
        pending = [describe_node.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False))
                   .remote(job.cwd, probe, job.script_path) for node in nodes]
        try:
            answers = ray.get(pending, timeout=readiness.NODE_CHECK_TIMEOUT)
        except ray.exceptions.GetTimeoutError:
            raise AccelkitError(f"not every node of the Ray cluster answered within {readiness.NODE_CHECK_TIMEOUT:g} s",
                                hint="check `ray status` on the head node") from None
        here = readiness.describe_node(job.cwd, probe, job.script_path)
    readiness.check_nodes(job, answers, here)


def _fit(job: RayJob) -> int:
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from accelkit.launch.raytrain.rank_process import run_rank

    trainer = TorchTrainer(
        run_rank,
        train_loop_config={"rank_argv": list(job.rank_argv), "cwd": job.cwd, "env": job.env},
        scaling_config=ScalingConfig(num_workers=job.num_workers, use_gpu=job.use_gpu,
                                     resources_per_worker=job.resources_per_worker()),
        # The workers' own group only carries Ray's bookkeeping; the ranks form theirs (NCCL on GPUs) themselves.
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(name=job.name, storage_path=job.storage,
                             failure_config=FailureConfig(max_failures=job.max_failures)),
    )
    try:
        trainer.fit()
    except Exception as exc:  # Ray Train's TrainingFailedError: a rank failed, a worker or node was lost
        return _failure_status(exc)
    return 0


def _failure_status(exc: Exception) -> int:
    """The exit status of a failed Ray Train run: the first failing rank's, with one line naming it."""
    from accelkit.launch.raytrain.rank_process import RankFailed

    failures = getattr(exc, "worker_failures", None) or {}
    ranks = [found for failure in failures.values() if (found := _find(failure, RankFailed)) is not None]
    if ranks:
        first = min(ranks, key=lambda failure: failure.when)
        print(f"Error: rank {first.rank} on node {first.node} failed first (exit status {first.exit_code})",
              file=sys.stderr, flush=True)
        return first.exit_code
    if failures:
        rank, failure = min(failures.items())
        where = _worker_location(failure)
        print(f"Error: Ray lost the worker of rank {rank}{where}: {_first_line(failure)}", file=sys.stderr,
              flush=True)
        print("  Hint: a node left the cluster or the worker was killed; --max-restarts N lets Ray restart the "
              "group and the script resume from its latest checkpoint", file=sys.stderr, flush=True)
        return 1
    print(f"Error: the Ray Train run failed: {_first_line(exc)}", file=sys.stderr, flush=True)
    return 1


def _chain(error: BaseException | None) -> list[BaseException]:
    """`error` and what it wraps, outermost first (Ray wraps a worker's exception once or twice)."""
    chain: list[BaseException] = []
    while error is not None and all(error is not seen for seen in chain):
        chain.append(error)
        error = getattr(error, "cause", None) or error.__cause__ or error.__context__
    return chain


def _find(error: BaseException, kind: type) -> BaseException | None:
    """`error`, or the exception of `kind` it wraps."""
    return next((found for found in _chain(error) if isinstance(found, kind)), None)


def _worker_location(error: BaseException) -> str:
    """" (node IP, pid P)" from the ActorDiedError Ray wraps in a lost worker's failure, when it says."""
    import re

    text = "\n".join(str(found) for found in _chain(error))
    node, pid = re.search(r"\bip: (\S+)", text), re.search(r"\bpid: (\d+)", text)
    parts = [f"node {node.group(1)}" if node else "", f"pid {pid.group(1)}" if pid else ""]
    return f" ({', '.join(part for part in parts if part)})" if node or pid else ""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


