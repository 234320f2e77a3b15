"""From the command line's values to a checked BenchSpec and the launch settings every run shares (no click here:
the command passes plain values, the library raises AccelkitError)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from accelkit.bench.comm import CPU_SIZES, GPU_SIZES, parse_message_size, size_range
from accelkit.bench.launching import (
    LaunchSettings,
    asked_backend,
    available_devices,
    backend_given,
    launch_settings,
    num_machines,
)
from accelkit.bench.layouts import check_world_size, parse_layouts
from accelkit.bench.spec import (
    BenchSpec,
    CommSettings,
    check_counts,
    data_parallel_degree,
    default_world_sizes,
    parse_backends,
    parse_int_list,
    resolve_global_batch,
)
from accelkit.configs import Mesh
from accelkit.errors import AccelkitError

DEFAULT_BACKEND = "ddp"  # benching scaling means data parallelism unless the user names another backend


def comm_settings(sizes: str | None, iters: int | None, cpu: bool) -> CommSettings:
    low, high = (sizes.split(":", 1) if sizes and ":" in sizes else (sizes, sizes) if sizes
                 else CPU_SIZES if cpu else GPU_SIZES)
    try:
        values = size_range(parse_message_size(low), parse_message_size(high))
    except AccelkitError as exc:
        raise AccelkitError(f"--comm-sizes {sizes}: {exc.message}", hint="e.g. --comm-sizes 64K:64M") from None
    except ValueError as exc:
        raise AccelkitError(f"--comm-sizes {sizes}: {exc}", hint="e.g. --comm-sizes 64K:64M") from None
    iters = iters or (5 if cpu else 20)
    from accelkit.limits import MAX_STEPS

    if iters > MAX_STEPS:
        raise AccelkitError(f"--comm-iters {iters:,} is beyond any measurement (the limit is {MAX_STEPS:,})",
                            hint="e.g. --comm-iters 20")
    return CommSettings(sizes=tuple(values), iters=iters, warmup=max(1, iters // 4))


def world_sizes(text: str | None, settings: LaunchSettings, cpu: bool, compare: bool) -> tuple[int, ...]:
    machines = num_machines(settings)
    if text is not None:
        sizes = parse_int_list(text, "--num-processes")
    else:
        sizes = tuple(n * machines for n in default_world_sizes(available_devices(cpu)))
        if compare:
            sizes = (max(sizes),)
    from accelkit.limits import MAX_PROCESSES

    huge = [n for n in sizes if n > MAX_PROCESSES]
    if huge:
        raise AccelkitError(f"--num-processes {huge[0]:,} is more than any cluster has (the limit is "
                            f"{MAX_PROCESSES:,})", hint="give world sizes such as 1,2,4,8 (processes in all)")
    uneven = [n for n in sizes if n % machines]
    if uneven:
        raise AccelkitError(f"--num-processes {', '.join(map(str, uneven))} cannot be spread evenly over "
                            f"{machines} machines", hint=f"use multiples of {machines} (processes are the total)")
    return sizes


def layouts_of(values: tuple[str, ...], settings: LaunchSettings, num_processes: str | None,
               compare_backends: str | None, comm: bool) -> tuple[tuple[Mesh, ...], int]:
    """--layouts checked against the options it cannot be combined with; the layouts and their world size."""
    if compare_backends is not None:
        raise AccelkitError("--layouts and --compare-backends both choose what each run launches",
                            hint="pass one; with --layouts, --backend (optional) sets the backend of every layout")
    given = [name for name in ("dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "pp_size")
             if getattr(settings.options, name, None) is not None]
    if given:
        flag = "--" + given[0].replace("_", "-")
        raise AccelkitError(f"--layouts and {flag} both set the parallelism sizes",
                            hint=f"drop {flag}: write the sizes in each layout, e.g. --layouts \"dp_shard=4;tp=4\"")
    if comm:
        raise AccelkitError("--comm cannot be combined with --layouts: every layout reports the collectives its "
                            "steps issue", hint="drop --comm (or run `accelkit bench --comm` on its own)")
    layouts = parse_layouts(values)
    pipeline_flag = next((flag for name, flag in (("pp_schedule", "--pp-schedule"), ("microbatches", "--microbatches"))
                          if getattr(settings.options, name, None) is not None), None)
    if pipeline_flag is not None and not any(layout.pp > 1 for layout in layouts):
        raise AccelkitError(f"{pipeline_flag} applies to a pipeline, but no layout of --layouts has pp",
                            hint=f"add a layout with pp=2 or more, e.g. --layouts \"dp_shard=4;dp_shard=2,pp=2\", "
                                 f"or drop {pipeline_flag}")
    sizes = parse_int_list(num_processes, "--num-processes") if num_processes is not None else None
    return layouts, check_world_size(layouts, sizes, num_machines(settings))


def build_spec(*, options: Any, config_file: Path | None, num_processes: str | None, compare_backends: str | None,
               cpu: bool, module: bool, steps: int, warmup: int, scaling: str, batch_arg: str | None,
               global_batch: int | None, output: Path, comm: bool, comm_sizes: str | None, comm_iters: int | None,
               timeout: float | None, show_output: bool, rdzv_backend: str | None, rdzv_conf: str | None,
               same_network: bool | None, script: str | None, script_args: tuple[str, ...],
               command_line: str, stall_timeout: float | None = None, min_time: float = 0.0,
               layouts: tuple[str, ...] = ()) -> tuple[BenchSpec, LaunchSettings]:
    check_counts(steps, warmup, min_time)
    settings = launch_settings(options, config_file, cpu, rdzv_backend=rdzv_backend, rdzv_conf=rdzv_conf,
                               same_network=same_network, command_line=command_line)
    if layouts:
        parsed, world = layouts_of(layouts, settings, num_processes, compare_backends, comm)
        degrees = tuple(sorted({data_parallel_degree(world, layout) for layout in parsed}))
        if scaling == "strong" and script is not None:
            global_batch = resolve_global_batch(script_args, batch_arg, global_batch, degrees)
        spec = BenchSpec(script=script, script_args=script_args, module=module, world_sizes=(world,),
                         backends=(asked_backend(settings),), steps=steps, warmup=warmup, scaling=scaling,
                         batch_arg=batch_arg, global_batch=global_batch, cpu=cpu, comm=None, output=output,
                         show_output=show_output, timeout=timeout, stall_timeout=stall_timeout,
                         machines=num_machines(settings), min_time=min_time, layouts=parsed)
        return spec, settings
    if compare_backends is not None:
        if asked_backend(settings) is not None:
            raise AccelkitError("--backend and --compare-backends both name the backend",
                                hint="pass one: --compare-backends ddp,fsdp,deepspeed runs each of them")
        backends: tuple[str | None, ...] = parse_backends(compare_backends)
    elif backend_given(settings):
        backends = (asked_backend(settings),)
    else:
        backends = (DEFAULT_BACKEND,)
    sizes = world_sizes(num_processes, settings, cpu, compare=compare_backends is not None)
    if scaling == "strong" and script is not None:
        global_batch = resolve_global_batch(script_args, batch_arg, global_batch, sizes)
    spec = BenchSpec(script=script, script_args=script_args, module=module, world_sizes=sizes, backends=backends,
                     steps=steps, warmup=warmup, scaling=scaling, batch_arg=batch_arg, global_batch=global_batch,
                     cpu=cpu, comm=comm_settings(comm_sizes, comm_iters, cpu) if comm else None, output=output,
                     show_output=show_output, timeout=timeout, stall_timeout=stall_timeout,
                     machines=num_machines(settings), min_time=min_time)
    return spec, settings
