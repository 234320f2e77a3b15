"""`accelkit bench` as one library call: check everything, run the sweep, write the results, say what they mean."""

from __future__ import annotations

import io
import os
import platform
import signal
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from accelkit.bench.cli_spec import build_spec
from accelkit.bench.launching import (
    LaunchSettings,
    available_devices,
    backend_of,
    check_request,
    check_script_exists,
    comm_request,
    launched_backend,
    script_request,
)
from accelkit.bench.plot import INSTALL_HINT, matplotlib_available, plot
from accelkit.bench.report import bench_csv, bench_json, summary_text
from accelkit.bench.rerun import split_command_line
from accelkit.bench.spec import RESULT_NAMES, BenchSpec, check_counts, check_output
from accelkit.bench.sweep import Sweep
from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.fsio import atomic_write, remove_path, write_error
from accelkit.shellwords import command_line


@dataclass
class BenchOutcome:
    lines: list[str]  # the table and the diagnosis (stdout)
    notes: list[str] = field(default_factory=list)  # where the files are, how to get the plot (stderr)
    exit_code: int = 0
    error: AccelkitError | None = None  # failed runs: reported after everything was written


def threads_per_rank(spec: BenchSpec, cores: int) -> dict[str, str]:
    """On CPU every run gives each rank the same cores (cores / largest world size), so speedup compares equal
    ranks; a user's OMP_NUM_THREADS wins."""
    if not spec.cpu or "OMP_NUM_THREADS" in os.environ:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, cores // max(spec.world_sizes)))}


def hardware(spec: BenchSpec, env: dict[str, str]) -> dict[str, Any]:
    threads = env.get("OMP_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS")
    facts: dict[str, Any] = {"machine": platform.machine(), "cpu_cores": available_devices(cpu=True),
                             "threads_per_rank": int(threads) if threads and threads.isdigit() else None,
                             "machines": spec.machines}
    if not spec.cpu:
        from accelkit.hardware import local_gpus

        gpus = local_gpus()
        if gpus.count:
            facts["gpus"] = gpus.count
            facts["gpu_name"] = gpus.name
    return facts


def _refuse_gpu_runs_without_gpus(spec: BenchSpec, settings: LaunchSettings,
                                  backends: dict[str | None, str]) -> None:
    """GPU runs on a machine without GPUs: one line whose hint is the bench command that runs here, with world
    sizes this machine's cores can hold (not launch's hint for one run)."""
    from accelkit.bench.launching import available_devices
    from accelkit.bench.spec import default_world_sizes
    from accelkit.hardware import gpu_count
    from accelkit.shellwords import command_line

    on_gpus = [b for b in backends.values() if b not in ("cpu", "single")]
    if settings.cpu or not on_gpus or gpu_count() > 0:
        return
    cores = available_devices(True)
    fits = [n for n in spec.world_sizes if n <= cores] or list(default_world_sizes(cores))
    backend = on_gpus[0]
    if settings.options.backend:
        said, same = f"--backend {backend}", ["--backend", backend]
    elif settings.config_file is not None:
        said, same = f"the {backend} config {settings.config_file}", ["--config", str(settings.config_file)]
    else:
        said, same = f"backend {backend} (the default)", []
    example = command_line("accelkit", "bench", "--cpu", "--num-processes", ",".join(map(str, fits)), *same,
                           spec.script or "train.py")
    raise AccelkitError(f"bench's runs use {said}, which runs on GPUs, and this machine has none",
                        hint=f"rehearse the sweep on CPU processes ({cores} core(s) here): {example} ...")


def check_every_launch(spec: BenchSpec, settings: LaunchSettings, backends: dict[str | None, str]) -> None:
    """Every launch of the sweep passes launch's own checks before the first one starts (a layout the rule set
    refuses is named with the rule's reason)."""
    _refuse_gpu_runs_without_gpus(spec, settings, backends)
    for run in spec.runs():
        backend = backends[run.backend]
        request = script_request(settings, launched_backend(backend, run.num_processes), run.num_processes,
                                 spec.script or "", run.script_args, spec.module, run.layout)
        try:
            check_request(request)
        except AccelkitError as exc:
            if run.layout is None:
                raise
            raise AccelkitError(f"--layouts {run.layout.name} ({backend}): {exc.message}", hint=exc.hint,
                                exit_code=exc.exit_code) from None
    if spec.comm is not None:
        for n in (n for n in spec.world_sizes if n >= 2):
            backend = backends[spec.backends[0]]
            check_request(comm_request(settings, launched_backend(backend, n), n, ()))


def save(sweep: Sweep, facts: dict[str, Any]) -> None:
    import json

    output = sweep.spec.output
    atomic_write(output / "bench.json", json.dumps(bench_json(sweep, facts), indent=2) + "\n")
    if sweep.records:
        atomic_write(output / "bench.csv", bench_csv(sweep))


def draw(sweep: Sweep) -> list[str]:
    if not any(r.summary is not None for r in sweep.records):
        return []
    path = sweep.spec.output / "scaling.png"
    if not matplotlib_available():
        return [f"scaling.png not drawn: matplotlib is not installed ({INSTALL_HINT}); the figures are in "
                f"{sweep.spec.output / 'bench.json'}"]
    label = "CPU rehearsal (gloo)" if sweep.spec.cpu else "GPUs"
    buffer = io.BytesIO()
    plot(sweep.records, buffer, f"accelkit bench: {Path(sweep.spec.script or '').name}, {label}, "
                                f"{sweep.spec.scaling} scaling")
    atomic_write(path, buffer.getvalue())
    return [f"plot: {path}"]


def run_bench(*, argv: tuple[str, ...], force: bool, progress: Callable[[str], None], script: str | None,
              script_args: tuple[str, ...], comm: bool, **values: Any) -> CommandResult:
    """`accelkit bench` as one call: the command line's values (`argv`: its words after the program name; `values`:
    build_spec's) in, each progress line said as `bench: ...`; the table and the notes, the exit status and the
    error that ends a failed sweep out. With --grad-compression or --reduce-dtype it is the compression run beside
    the uncompressed one instead (accelkit.bench.compression_cli)."""
    from accelkit.bench.compression_cli import run_compression_command, wants_compression_bench

    if wants_compression_bench(values["options"]):  # compression vs none, same seed
        return run_compression_command(force=force, progress=progress, script=script, script_args=script_args,
                                       comm=comm, **values)
    command_words, script_words = split_command_line(argv, script, script_args)
    if script is None and not comm:
        raise AccelkitError("no SCRIPT to bench", hint="accelkit bench [OPTIONS] SCRIPT [SCRIPT_ARGS]..., or "
                                                       "`accelkit bench --comm` alone for the interconnect check")
    spec, settings = build_spec(script=script, script_args=script_args, comm=comm,
                                command_line=command_line("accelkit", *argv), **values)
    spec = replace(spec, command_words=command_words, script_words=script_words)
    outcome = run_sweep(spec, settings, force, lambda line: progress(f"bench: {line}"))
    result = CommandResult(exit_code=outcome.exit_code, error=outcome.error)
    for line in outcome.lines:
        result.out(line)
    for note in outcome.notes:
        result.err(f"bench: {note}")
    return result


def run_sweep(spec: BenchSpec, settings: LaunchSettings, force: bool,
              progress: Callable[[str], None]) -> BenchOutcome:
    """Check everything, run the sweep, write the results; the outcome to print."""
    check_counts(spec.steps, spec.warmup, spec.min_time)
    check_output(spec.output, force)
    if spec.script is not None:
        check_script_exists(spec.script, spec.module)
    asked = dict.fromkeys([*spec.backends, *(run.backend for run in spec.runs())])
    backends = {name: backend_of(settings, name) for name in asked}
    check_every_launch(spec, settings, backends)

    if force:
        for name in RESULT_NAMES:  # only what an earlier bench wrote; other files in DIR stay
            remove_path(spec.output / name)
    env = threads_per_rank(spec, available_devices(cpu=True))
    facts = hardware(spec, env)
    try:
        (spec.output / "runs").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(exc, spec.output) from None
    sweep = Sweep(spec, settings, backends, env, progress, lambda s: save(s, facts))
    if env:
        progress(f"CPU: {env['OMP_NUM_THREADS']} thread(s) per rank at every world size "
                 "(set OMP_NUM_THREADS to choose)")
    sweep.run_comm()
    if sweep.stopped is None:
        sweep.run_script()
    sweep.finish()
    save(sweep, facts)
    notes = draw(sweep)
    files = "bench.json, bench.csv" if sweep.records else "bench.json"
    notes.append(f"results: {spec.output}/ ({files}; each run's output and per-rank step records in runs/)")
    outcome = BenchOutcome(lines=summary_text(sweep, spec), notes=notes)
    if sweep.interrupted_by is not None:
        outcome.exit_code = 128 + sweep.interrupted_by
        outcome.notes.append(f"interrupted (signal {signal.Signals(sweep.interrupted_by).name}): the runs that "
                             f"finished are in {spec.output}/bench.json")
        return outcome
    failed = [r for r in [*sweep.comm, *sweep.records] if r.status != "ok"]
    if failed:
        first = failed[0]
        stopped = f"; {sweep.stopped}" if sweep.stopped else ""
        where = "the script's output above" if spec.show_output else spec.output / "runs" / first.folder_name / \
            "output.log"
        outcome.error = AccelkitError(f"{len(failed)} of {len(sweep.records) + len(sweep.comm)} run(s) failed, "
                                      f"first {first.label}: {first.error}{stopped}", hint=f"see {where}")
        outcome.exit_code = 1
    return outcome
