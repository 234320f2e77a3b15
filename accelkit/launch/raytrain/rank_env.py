"""The environment each rank of a launch gets from Accelerate's own launcher, computed without launching.

`accelerate launch --config_file C` turns the config into environment variables (ACCELERATE_USE_FSDP, FSDP_*,
ACCELERATE_DEEPSPEED_*, ACCELERATE_MIXED_PRECISION, ...) that `Accelerator()` reads in every rank. Under Ray there is
no torchrun: the same variables are computed here, with Accelerate's own parser and functions, and handed to each
Ray worker's rank process.
"""

from __future__ import annotations

import os

from accelkit.launch.launch_plan import LaunchPlan

# Set by torchrun or the driver's machine, not by the config: Ray decides them per worker.
_LAUNCHER_ONLY = frozenset({"CUDA_VISIBLE_DEVICES", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                            "LOCAL_WORLD_SIZE", "NODE_RANK"})


def accelerate_rank_env(plan: LaunchPlan) -> dict[str, str]:
    """The variables Accelerate's launcher would add for `plan`'s config (its difference from this environment),
    plus the plan's own (a CPU rehearsal's, probes, pipeline and compression settings)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args(plan.launcher_args())
    args, defaults, mp_from_config_flag = _validate_launch_command(args)
    if args.use_deepspeed and not args.cpu:
        # what launch_command does before its DeepSpeed launcher
        fields = list(defaults.deepspeed_config.keys()) if defaults else []
        if mp_from_config_flag:
            fields.append("mixed_precision")
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        env = prepare_deepspeed_cmd_env(args)[1]
    elif (args.use_fsdp or args.multi_gpu or args.use_megatron_lm) and not args.cpu:
        env = prepare_multi_gpu_env(args)
    else:
        env = prepare_simple_launcher_cmd_env(args)[1]
    added = {name: value for name, value in env.items()
             if os.environ.get(name) != value and name not in _LAUNCHER_ONLY}
    added.update(plan.env)
    return added
