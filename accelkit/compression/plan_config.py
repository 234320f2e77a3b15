"""`accelkit plan --grad-compression M --write-config FILE`: the compression carried into the config plan writes.

The recommended strategy's ConfigOptions get the same fields `accelkit config --grad-compression` takes, so the file
is built, checked and written by the same builder (a DDP/FSDP config carries the `# accelkit-grad-compression:` line
`accelkit launch` reads; ZeRO-3's int8 is ZeRO++ in a DeepSpeed JSON written beside FILE, accepted by DeepSpeed's
own config class before anything is written). A method the strategy cannot take is refused in one line: a config
that silently dropped it would not be the run that was planned.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.compression.compression_spec import CompressionSpec
from accelkit.errors import AccelkitError

# What each strategy family can take (accelkit.compression.checks has the reasons): DDP hooks, FSDP2's reduce dtype,
# ZeRO++ at stage 3.
_TAKES = {"torch": ("fp16", "bf16", "powersgd"), "fsdp": ("fp16", "bf16"), "deepspeed": ("int8",)}
_USE = {"torch": "fp16, bf16 or powersgd", "fsdp": "fp16 or bf16 (the reduce dtype)", "deepspeed": "int8 at ZeRO-3"}


def deepspeed_json_beside(path: Path) -> Path:
    """Where plan writes the DeepSpeed JSON of FILE: FILE's name with .json (`plan.yaml` -> `plan.json`)."""
    path = Path(path)
    return path.with_suffix(".json") if path.suffix != ".json" else path.with_name(f"{path.stem}.deepspeed.json")


def options_with_compression(options: Any, strategy: Any, spec: CompressionSpec, path: Path) -> Any:
    """`options` (the chosen strategy's ConfigOptions) with `spec` in the fields `accelkit config` reads; AccelkitError
    (one line + hint) where the strategy cannot take it."""
    if not spec.active:
        return options
    family = strategy.family if strategy.distributed else "single"
    takes = _TAKES.get(family, ()) if family != "deepspeed" or strategy.zero_stage == 3 else ()
    if spec.method not in takes:
        if family == "single":
            fix = "drop --grad-compression: one process sends no gradients"
        elif not takes:
            fix = "int8 is ZeRO++, which is ZeRO-3's: use --strategy zero3, or drop --grad-compression"
        else:
            fix = f"for {strategy.name} use --grad-compression {_USE[family]}, or pick another --strategy"
        raise AccelkitError(f"--write-config: --grad-compression {spec.method} does not apply to the recommended "
                            f"{strategy.label}", hint=fix)
    fields: dict[str, Any] = {"grad_compression": spec.method}
    if spec.method == "powersgd":
        fields.update(powersgd_rank=spec.powersgd_rank, powersgd_start_step=spec.powersgd_start_step)
    if spec.method == "int8":
        fields["deepspeed_json"] = deepspeed_json_beside(path)
    return replace(options, **fields)
