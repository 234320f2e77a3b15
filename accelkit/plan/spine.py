"""The one place `accelkit plan` touches the config -> launch spine (ConfigOptions, resolve_config, write_config,
LaunchRequest, run_request): a strategy becomes exactly the options `accelkit config` takes, the command that
writes them, the file, and the launch that measures it."""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path

from accelkit.plan.catalog import Strategy
from accelkit.plan.inputs import MIXED_PRECISION, Hardware, Training


def config_options(strategy: Strategy, hardware: Hardware, training: Training, accumulation: int):
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


def config_command(options, output: Path | str) -> str:
    from dataclasses import fields

    from accelkit.configs.options import flag_name

    parts = ["accelkit", "config"]
    for f in fields(options):
        value = getattr(options, f.name)
        if value is None or value == () or value is False:
            continue
        parts += [flag_name(f.name)] if value is True else [flag_name(f.name), str(value)]
    return shlex.join([*parts, "-o", str(output)])


def launch_command(config: Path | str, script: str, strategy: Strategy, accumulation: int) -> str:
    parts = ["accelkit", "launch", "--config", str(config)]
    if accumulation > 1 and strategy.family != "deepspeed":  # DeepSpeed keeps it in its config
        parts += ["--gradient-accumulation-steps", str(accumulation)]
    return shlex.join([*parts, script])


def write_config_file(options, path: Path, command_line: str) -> None:
    """Build through the same builder as `accelkit config` (Accelerate's own checks included) and write."""
    from accelkit.configs import resolve_config, write_config

    write_config(resolve_config(options), path, command_line)


def run_measurement(options, script: str, args: tuple[str, ...], cpu: bool, probe_dir: Path, probe: str,
                    max_steps: int, command_line: str) -> int:
    """Launch the user's script with the plan's probe in every rank and a step limit; return the exit status."""
    from accelkit.launch.plan import LaunchTarget
    from accelkit.launch.prepare import check_target
    from accelkit.launch.request import LaunchRequest
    from accelkit.launch.run import run_request
    from accelkit.probes import MAX_STEPS_ENV, PROBE_DIR_ENV

    target = LaunchTarget(script=script, args=tuple(args))
    check_target(target)
    request = LaunchRequest(target=target, options=options, cpu=cpu, probes=(probe,), command_line=command_line)
    saved = {name: os.environ.get(name) for name in (PROBE_DIR_ENV, MAX_STEPS_ENV)}
    os.environ[PROBE_DIR_ENV], os.environ[MAX_STEPS_ENV] = str(probe_dir), str(max_steps)
    with _script_output_to_stderr():
        try:
            return run_request(request)
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


@contextlib.contextmanager
def _script_output_to_stderr():
    """The ranks inherit file descriptor 1: point it at stderr while they run, so stdout carries only the plan
    (and `--json` stays parseable)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
