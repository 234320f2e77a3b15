"""Accelerate configs: preset + options -> validated config dict -> commented YAML (+ DeepSpeed JSON).

Importing this package is cheap: accelerate, torch and yaml are imported inside the functions that need them.
"""

from accelkit.configs.build import BuiltConfig, build_config, check_options
from accelkit.configs.check import check_config, load_config
from accelkit.configs.options import ConfigOptions
from accelkit.configs.presets import Preset, list_presets, load_preset
from accelkit.configs.render import render_json, render_yaml, write_config, write_deepspeed_json
from accelkit.configs.validate import Finding, problems

__all__ = ["BuiltConfig", "ConfigOptions", "Finding", "Preset", "build_config", "check_config", "check_options",
           "list_presets", "load_config", "load_preset", "problems", "render_json", "render_yaml", "write_config",
           "write_deepspeed_json"]
