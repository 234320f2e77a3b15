"""`accelkit bench --grad-compression METHOD [--layouts ...] SCRIPT`: the compression run beside the uncompressed one,
per backend or per N-D layout, one call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from accelkit.bench.compression import compression_table, run_compression_bench
from accelkit.bench.compression_runs import plan_runs
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
    from accelkit.bench.launching import launch_settings
    from accelkit.launch import LaunchTarget, check_target

    if script is None:
        raise AccelkitError("--grad-compression needs a SCRIPT to train",
                            hint="accelkit bench --cpu --backend ddp --num-processes 2 --grad-compression fp16 "
                                 "train.py --max-steps 20")
    for name, flag in (("comm", "--comm"), ("global_batch", "--global-batch"), ("batch_arg", "--batch-arg")):
        if _ignored.get(name):
            raise AccelkitError(f"--grad-compression and {flag} are separate benches",
                                hint=f"run `accelkit bench {flag} ...` and `accelkit bench --grad-compression ...` "
                                     "one after the other")
    check_target(LaunchTarget(script=script))
    spec = spec_of_options(options)
    layouts = _ignored.get("layouts") or ()
    if layouts:
        places, world = _layout_places(options, layouts, num_processes, compare_backends)
    else:
        world = _one_world_size(num_processes)
        backends = [b.strip() for b in compare_backends.split(",")] if compare_backends \
            else [options.backend or "ddp"]
        if options.reduce_dtype is not None and "fsdp" not in backends:
            backends = ["fsdp"]
        places = [(backend, None) for backend in backends]
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
    # launch's own checks for every run, before any starts: a layout that cannot run is refused; a compression a
    # layout cannot take is a row that says why (compression_runs)
    runs = plan_runs(settings, [spec], places, world, script, script_args,
                     reduce_dtype=options.reduce_dtype is not None)
    if not any(run.spec.active and run.not_applicable is None for run in runs):
        first = next(run for run in runs if run.spec.active)
        raise AccelkitError(first.not_applicable or f"--grad-compression {spec.method} applies to no run",
                            hint=first.hint or "pick a compression the backend or layout takes "
                                               "(docs/guides/gradient-compression.md)")
    result = CommandResult()
    warning = start_step_warning(spec, steps)
    if warning:
        result.err(f"bench: warning: {warning}")
    output.mkdir(parents=True, exist_ok=True)
    rows = run_compression_bench(script=script, script_args=script_args, specs=[spec], backends=(),
                                 num_processes=world, cpu=cpu, output=output, steps=steps, settings=settings,
                                 progress=lambda line: progress(f"bench: {line}"), runs=runs)
    for line in compression_table(rows):
        result.out(line)
    result.err(f"bench: results: {output}/ (compression.json, compression.csv, compression.png; runs/)")
    return result


def _layout_places(options: Any, layouts: tuple[str, ...], num_processes: str | None,
                   compare_backends: str | None) -> tuple[list[tuple[str, Any]], int]:
    """--layouts with --grad-compression: (backend, layout) per layout (--backend, else the layout's own) and the
    world size they share."""
    from accelkit.bench.layouts import check_world_size, parse_layouts
    from accelkit.bench.spec import parse_int_list

    if compare_backends is not None:
        raise AccelkitError("--layouts and --compare-backends both choose what each run launches",
                            hint="pass one; with --layouts, --backend (optional) sets the backend of every layout")
    given = [name for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "pp_size")
             if getattr(options, name, None) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise AccelkitError(f"--layouts and {flag} both set the parallelism sizes",
                            hint=f"drop {flag}: write the sizes in each layout, e.g. --layouts \"dp_shard=2;tp=2\"")
    parsed = parse_layouts(layouts)
    pipeline = next((layout for layout in parsed if layout.pp > 1), None)
    if pipeline is not None:  # the template's pipeline trains its stages itself, outside Accelerate's prepare
        raise AccelkitError(f"--grad-compression with --layouts {pipeline.name}: a pipeline's stages are not "
                            "prepared by Accelerate, where a compression is applied",
                            hint="compare the pipeline without --grad-compression (accelkit bench --layouts ...)")
    sizes = parse_int_list(num_processes, "--num-processes") if num_processes is not None else None
    world = check_world_size(parsed, sizes, int(options.num_machines or 1))
    return [(options.backend or layout.natural_backend, layout) for layout in parsed], world


def _one_world_size(text: str | None) -> int:
    if text is None:
        return 2
    if not text.strip().isdigit() or int(text) < 2:
        raise AccelkitError(f"--grad-compression compares at one world size of 2 or more, not --num-processes {text}",
                            hint="give one number, e.g. --num-processes 2")
    return int(text)
