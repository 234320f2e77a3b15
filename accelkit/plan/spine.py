"""The one place `accelkit plan` touches the config -> launch spine (ConfigOptions, resolve_config, write_config,
LaunchRequest, run_supervised): a strategy becomes exactly the options `accelkit config` takes, the command that
writes them, the file, and the launch that measures it."""

from __future__ import annotations

import os
from pathlib import Path

from accelkit.plan.catalog import Strategy
from accelkit.plan.inputs import MIXED_PRECISION, Hardware, Training
from accelkit.shellwords import ShellVariable, command_line

# What differs between the machines of a multi-machine job, in the commands the plan prints: each machine sets them
# before running the same two lines (config refuses several machines without machine 0's address).
MAIN_ADDRESS = ShellVariable("MAIN_PROCESS_IP")
MACHINE_RANK = ShellVariable("MACHINE_RANK")
MACHINES_NOTE = (f"(on every machine first set {MAIN_ADDRESS.name} to machine 0's address and {MACHINE_RANK.name} to "
                 "its rank, 0 for machine 0; the same two commands then run on each)")


def config_options_for(strategy: Strategy, hardware: Hardware, training: Training, accumulation: int):
    """The ConfigOptions `accelkit config` would build for this strategy on this hardware."""
    from accelkit.configs import ConfigOptions

    given: dict = {"mixed_precision": MIXED_PRECISION[training.precision]}
    if not strategy.distributed:
        return ConfigOptions(backend="single", num_processes=1, **given)
    given["backend"] = {"torch": "ddp", "fsdp": "fsdp", "deepspeed": "deepspeed"}[strategy.family]
    given["num_processes"] = hardware.gpus
    if hardware.nodes > 1:
        given["num_machines"] = hardware.nodes
    if strategy.family == "fsdp":
        given["sharding"] = strategy.sharding
        if strategy.offload:
            given["offload"] = True
        if training.activation_checkpointing:
            given["activation_checkpointing"] = True
    elif strategy.family == "deepspeed":
        given["zero_stage"] = strategy.zero_stage
        if strategy.offload:
            given["offload"] = True
        if accumulation > 1:  # DeepSpeed's config holds it; the other backends get it at launch
            given["gradient_accumulation_steps"] = accumulation
    return ConfigOptions(**given)


def layout_options(layout, hardware: Hardware, training: Training, checkpointing: bool):
    """The ConfigOptions of an N-D or pipeline layout (plan/nd.py's Layout): the flags its printed command
    carries, a pipeline's (--pp-size, --pp-schedule, --microbatches) included."""
    from accelkit.configs import ConfigOptions

    given: dict = {"backend": layout.backend, "num_processes": hardware.gpus,
                   "mixed_precision": MIXED_PRECISION[training.precision]}
    if hardware.nodes > 1:
        given["num_machines"] = hardware.nodes
    if layout.backend == "deepspeed":
        given["zero_stage"] = 3
    elif checkpointing and layout.backend == "fsdp":
        given["activation_checkpointing"] = True
    shard = 1 if layout.backend == "deepspeed" else layout.mesh.dp_shard
    sizes = {"dp_replicate_size": layout.mesh.dp_replicate, "dp_shard_size": shard, "tp_size": layout.mesh.tp,
             "cp_size": layout.mesh.cp, "sp_size": layout.mesh.sp}
    if layout.mesh.pp > 1:
        sizes.update(pp_size=layout.mesh.pp, pp_schedule=layout.pipeline.schedule.lower(),
                     microbatches=layout.pipeline.microbatches)
    given.update({name: value for name, value in sizes.items() if value != 1})
    return ConfigOptions(**given)


def config_command(options, output: Path | str) -> str:
    """The printed `accelkit config` line; on several machines with machine 0's address as a shell variable."""
    if (options.num_machines or 1) > 1 and options.main_process_ip is None:
        from dataclasses import replace

        options = replace(options, main_process_ip=MAIN_ADDRESS)
    return options.config_command(output)


def launch_command(config: Path | str, script: str, strategy: Strategy, accumulation: int, machines: int = 1) -> str:
    in_launch = accumulation > 1 and strategy.family != "deepspeed"  # DeepSpeed keeps it in its config
    flags = [("--config", config), ("--machine-rank", MACHINE_RANK if machines > 1 else None),
             ("--gradient-accumulation-steps", accumulation if in_launch else None)]
    return command_line("accelkit", "launch", flags=flags, args=[script])


def write_config_file(options, path: Path, command_line: str, force: bool = False) -> Path | None:
    """Build through the same builder as `accelkit config` (Accelerate's own checks included) and write; the
    DeepSpeed JSON written beside it (ZeRO++), if any."""
    from accelkit.configs import resolve_config, write_config
    from accelkit.fsio import refuse_overwrite

    config = resolve_config(options)
    json_path = config.json_path()
    if json_path is not None:
        refuse_overwrite(json_path, force)
    write_config(config, path, command_line)
    return json_path


def run_measurement(options, script: str, args: tuple[str, ...], cpu: bool, probe_dir: Path, probe: str,
                    max_steps: int, command_line: str, stall_timeout: float | None = None):
    """Launch the user's script with the plan's probe in every rank and a step limit, supervised
    (accelkit.launch.run_supervised); return its RunOutcome. The ranks' stdout goes to this process's stderr, so
    stdout carries only the plan (and `--json` stays parseable)."""
    from accelkit.launch import LaunchRequest, LaunchTarget, Stream, SupervisedRun, check_target, run_supervised
    from accelkit.ranks.probes import MAX_STEPS_ENV, PROBE_DIR_ENV

    target = LaunchTarget(script=script, args=tuple(args))
    check_target(target)
    request = LaunchRequest(target=target, options=options, cpu=cpu, command_line=command_line)
    env = {**os.environ, PROBE_DIR_ENV: str(probe_dir), MAX_STEPS_ENV: str(max_steps)}
    return run_supervised(SupervisedRun(request, env=env, probes=(probe,), stall_timeout=stall_timeout,
                                        stdout=Stream.STDERR))
