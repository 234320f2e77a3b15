"""Helpers for the config tests: read a YAML back the way `accelerate launch` does, without starting processes."""

from __future__ import annotations

from pathlib import Path

import yaml


def accelerate_roundtrip(path: Path, written: dict) -> dict:
    """Load `path` with Accelerate's own loader and check every key accelkit wrote comes back with the same value."""
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file

    loaded = load_config_from_file(str(path))
    assert isinstance(loaded, ClusterConfig)
    back = loaded.to_dict()
    for key, value in written.items():
        assert back[key] == value, f"{key}: wrote {value!r}, Accelerate read {back[key]!r}"
    assert yaml.safe_load(path.read_text()) == dict(written)
    return back


def launcher_env(path: Path) -> tuple[object, dict[str, str]]:
    """Parse `accelerate launch --config_file path train.py` exactly as the launcher does and return the namespace
    plus the environment it would give the ranks (no process is started)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import (
        prepare_deepspeed_cmd_env,
        prepare_multi_gpu_env,
        prepare_simple_launcher_cmd_env,
    )

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    if args.use_deepspeed:
        fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    elif args.use_fsdp or args.multi_gpu:
        env = prepare_multi_gpu_env(args)
    else:
        _, env = prepare_simple_launcher_cmd_env(args)
    return args, env


def build_plugin(env: dict[str, str], monkeypatch):
    """Construct the FSDP or DeepSpeed plugin as a rank would, from the launcher's environment."""
    for key, value in env.items():
        if key.startswith(("ACCELERATE_", "FSDP_")):
            monkeypatch.setenv(key, value)
    if env.get("ACCELERATE_USE_FSDP") == "true":
        from accelerate.utils import FullyShardedDataParallelPlugin

        if env.get("FSDP_VERSION") == "1":
            # FSDP1 syncs module states onto a GPU device at construction; none exists here.
            monkeypatch.setenv("FSDP_SYNC_MODULE_STATES", "false")
            monkeypatch.setenv("FSDP_CPU_RAM_EFFICIENT_LOADING", "false")
        return FullyShardedDataParallelPlugin()
    if env.get("ACCELERATE_USE_DEEPSPEED") == "true":
        from accelerate.utils import DeepSpeedPlugin

        return DeepSpeedPlugin()
    return None



def findings(config: dict, deepspeed_json: dict | None = None) -> list:
    """Every finding for an Accelerate config dict as it is, through the typed API (read_config, then the one rule
    set): what `accelkit config --check` reports for a file, apart from Accelerate's own loader."""
    from accelkit.configs.reader import read_config
    from accelkit.configs.rules import check_rules

    resolved, found = read_config(config, json_content=deepspeed_json)
    return found + check_rules(resolved) if resolved is not None else found
