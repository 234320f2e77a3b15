"""`accelkit bench --grad-compression METHOD SCRIPT`: the compression run beside the uncompressed one, one call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.bench.compression import compression_table, run_compression_bench
from accelkit.command_result import CommandResult
from accelkit.compression.checks import spec_of_options, start_step_warning
from accelkit.errors import AccelkitError

_CLEARED = {"grad_compression": None, "powersgd_rank": None, "powersgd_start_step": None, "reduce_dtype": None}


def wants_compression_bench(options: Any) -> bool:
    return options.grad_compression not in (None, "none") or options.reduce_dtype not in (None, "fp32")


def run_compression_command(*, options: Any, script: str | None, script_args: tuple[str, ...], cpu: bool,
                            steps: int, output: Path, force: bool, num_processes: str | None,
                            compare_backends: str | None, config_file: Path | None,
                            progress: Callable[[str], None], **_ignored: Any) -> CommandResult:
    from accelkit.bench.launching import check_request, launch_settings, request_for
    from accelkit.launch import LaunchTarget, check_target

    if script is None:
        raise AccelkitError("--grad-compression needs a SCRIPT to train",
                            hint="accelkit bench --cpu --backend ddp --num-processes 2 --grad-compression fp16 "
                                 "train.py --max-steps 20")
    for name, flag in (("layouts", "--layouts"), ("comm", "--comm"), ("global_batch", "--global-batch"),
                       ("batch_arg", "--batch-arg")):
        if _ignored.get(name):
            raise AccelkitError(f"--grad-compression and {flag} are separate benches",
                                hint=f"run `accelkit bench {flag} ...` and `accelkit bench --grad-compression ...` "
                                     "one after the other")
    check_target(LaunchTarget(script=script))
    spec = spec_of_options(options)
    world = _one_world_size(num_processes)
    backends = [b.strip() for b in compare_backends.split(",")] if compare_backends else [options.backend or "ddp"]
    if options.reduce_dtype is not None and "fsdp" not in backends:
        backends = ["fsdp"]
    if steps < 2:
        raise AccelkitError(f"--steps {steps}: a comparison needs 2 or more steps", hint="use --steps 20")
    if (output / "compression.json").exists() and not force:
        raise AccelkitError(f"-o {output} already holds results (compression.json)",
                            hint="pass another -o DIR, or --force to replace them")
    if output.exists() and not output.is_dir():
        raise AccelkitError(f"-o {output}: a file is in the way (results are a folder)",
                            hint="pass -o with a folder name, e.g. -o bench-results")
    base = replace(options, backend=None, num_processes=None, **_CLEARED)
    settings = launch_settings(base, config_file, cpu, command_line="accelkit bench --grad-compression")
    spec_fields = {"grad_compression": spec.method, "powersgd_rank": options.powersgd_rank,
                   "powersgd_start_step": options.powersgd_start_step}
    for backend in backends:  # launch's own checks, before any run starts
        checked = replace(settings, options=replace(base, **spec_fields))
        check_request(request_for(checked, backend, world, script, script_args, module=False, probes=()))
    result = CommandResult()
    warning = start_step_warning(spec, steps)
    if warning:
        result.err(f"bench: warning: {warning}")
    output.mkdir(parents=True, exist_ok=True)
    rows = run_compression_bench(script=script, script_args=script_args, specs=[spec], backends=backends,
                                 num_processes=world, cpu=cpu, output=output, steps=steps, settings=settings,
                                 progress=lambda line: progress(f"bench: {line}"))
    for line in compression_table(rows):
        result.out(line)
    result.err(f"bench: results: {output}/ (compression.json, compression.csv, compression.png; runs/)")
    return result


def _one_world_size(text: str | None) -> int:
    if text is None:
        return 2
    if not text.strip().isdigit() or int(text) < 2:
        raise AccelkitError(f"--grad-compression compares at one world size of 2 or more, not --num-processes {text}",
                            hint="give one number, e.g. --num-processes 2")
    return int(text)
