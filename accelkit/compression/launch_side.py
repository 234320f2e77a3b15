"""What `accelkit launch` does with gradient compression: read a written config's comment line, export the choice to
the ranks, and warn when PowerSGD would start after the run ends."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.compression.checks import GLOO_BF16, start_step_warning, steps_of_script
from accelkit.compression.compression_spec import ENV_VAR, read_compression_comment
from accelkit.errors import AccelkitError


def compression_with_config_comment(options: Any, labels: dict[str, str], config_file: Path) -> tuple[Any, dict]:
    """`options` plus the compression a config written by `accelkit config` carries (given options win)."""
    from accelkit.configs import comment_spec

    if options.grad_compression is not None or options.reduce_dtype is not None:
        return options, labels
    spec = comment_spec(config_file, read_compression_comment)
    if spec is None:
        return options, labels
    given = {"grad_compression": spec.method}
    if spec.method == "powersgd":
        given.update(powersgd_rank=spec.powersgd_rank, powersgd_start_step=spec.powersgd_start_step)
    return replace(options, **given), {**labels, **{name: str(config_file) for name in given}}


def compression_env_and_notes(config: Any, request: Any) -> tuple[dict[str, str], tuple[str, ...]]:
    """The variable the ranks read, and the notes worth telling (the PowerSGD start step against --max-steps)."""
    spec = config.grad_compression
    on_cpu = bool(request.cpu) or config.runs_on_cpu
    if on_cpu and spec.method == "bf16" and config.backend.value in ("ddp", "cpu"):
        raise AccelkitError(f"--grad-compression bf16 on CPU ranks: {GLOO_BF16}",
                            hint="rehearse with --grad-compression fp16 (same bytes) on CPU; keep bf16 for GPU runs")
    if on_cpu and spec.method == "int8":
        raise AccelkitError("--grad-compression int8 on CPU ranks: ZeRO++'s quantization kernels need CUDA",
                            hint="check the config with `accelkit config` and `accelkit plan`; run it on GPUs")
    if spec.method == "int8":
        return {}, ()  # in the DeepSpeed JSON
    warning = start_step_warning(spec, steps_of_script(request.target.args))
    return {ENV_VAR: spec.env_value()}, ((f"warning: {warning}",) if warning else ())
