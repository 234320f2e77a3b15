"""`accelkit config` as one library call: write (or print) the config the options resolve to, list the presets, or
check an existing config file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.configs.files import check_config
from accelkit.configs.options import ConfigOptions
from accelkit.configs.presets import list_presets


def run_config(options: ConfigOptions, output: Path | None = None, *, force: bool = False, listing: bool = False,
               check: Path | None = None) -> CommandResult:
    """The YAML for `options` to `output` (None: printed), or the preset list, or the findings on `check`."""
    if listing:
        return presets_listing()
    if check is not None:
        return checked(check)
    from accelkit.configs.render import render_yaml, write_config, write_deepspeed_json
    from accelkit.fsio import refuse_overwrite

    config = _resolve_with_zeropp_json(options, output)
    result = CommandResult()
    for finding in config.findings:
        result.err(finding.lines())
    line = options.config_command(output)  # the YAML's header
    json_path = config.json_path()
    with result.ends_on_error():
        for path in [p for p in (output, json_path) if p is not None]:
            refuse_overwrite(path, force)
        if output is None:
            if json_path is not None:
                result.err(f"Wrote the DeepSpeed JSON to {write_deepspeed_json(config)}")
            return result.out(render_yaml(config, line), nl=False)
        write_config(config, output, line)
        result.out(f"Wrote {output}" + (f" and {json_path}" if json_path is not None else "") +
                   f" ({config.distributed_type}, {config.num_processes} process(es)"
                   f" on {config.num_machines} machine(s)).")
        result.out(f"Launch: accelerate launch --config_file {output} your_script.py")
    return result


def _resolve_with_zeropp_json(options: ConfigOptions, output: Path | None):
    """The resolved config; for a DeepSpeed config with --grad-compression int8 and no --deepspeed-json, the
    ZeRO++ keys (which live only in a DeepSpeed JSON) go to one written beside the YAML: OUTPUT.deepspeed.json."""
    from accelkit.configs.resolve import resolve_config
    from accelkit.errors import AccelkitError

    try:
        return resolve_config(options)
    except AccelkitError as first:
        if output is None or options.grad_compression != "int8" or options.deepspeed_json is not None:
            raise
        try:
            return resolve_config(replace(options, deepspeed_json=output.with_name(f"{output.stem}.deepspeed.json")))
        except AccelkitError:
            raise first from None  # this config cannot take ZeRO++ at all (another backend, another stage)


def presets_listing() -> CommandResult:
    presets, result = list_presets(), CommandResult()
    width = max((len(p.name) for p in presets), default=0)
    for p in presets:
        result.out(f"{p.name.ljust(width)}  {p.description}")
    if presets:
        result.err(f"\nUse one with `accelkit config --preset NAME [options] -o my.yaml`, or launch it as it is: "
                   f"`accelerate launch --config_file {presets[0].path.parent}/NAME.yaml ...`.")
    return result


def checked(path: Path) -> CommandResult:
    """`config --check`: every finding with its fix, then the verdict (exit 1 on errors)."""
    findings, result = check_config(path), CommandResult()
    for finding in findings:
        result.err(finding.lines())
    errors = sum(f.is_error for f in findings)
    warnings = len(findings) - errors
    if errors:
        result.err(f"{path}: {errors} error(s), {warnings} warning(s).").exit_code = 1
        return result
    return result.out(f"{path}: OK: Accelerate's loader accepts it" +
                      (f"; {warnings} warning(s)." if warnings else "."))
