"""From a LaunchRequest to a LaunchPlan: resolve the config (accelkit.configs), decide CPU rehearsal
(accelkit.rehearsal), check what can be checked before anything starts (script, GPUs, DeepSpeed, the rendezvous
port; a ZeRO checkpoint of another world size the script resumes from: launch.zero_resume), write the config file,
then call the pure plan function."""

from __future__ import annotations

import importlib.util
import sys
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from accelkit.configs import Backend, ResolvedConfig
from accelkit.errors import AccelkitError
from accelkit.launch import ports
from accelkit.launch.launch_plan import LauncherFlags, LaunchPlan, LaunchTarget, plan_launch
from accelkit.launch.request import LaunchRequest
from accelkit.launch.summary import summary_lines

ACCUMULATION_ENV = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"  # what Accelerator() reads when its config has no key
FSDP2_TP_MODULE = "accelkit.ranks.fsdp2_tp_compat"  # the rank module of the FSDP2 x TP workaround (its MODULE)


@dataclass
class PreparedLaunch:
    plan: LaunchPlan
    summary: list[str]  # what was used and where each value came from, one line each
    temp_dir: Path | None  # created for the config file; the caller removes it when the job is over


RANK_PREFIX_PROBE = "accelkit.ranks.rank_output"


def check_target(target: LaunchTarget, cwd: Path | None = None) -> None:
    """The script (or module) must exist before any process starts."""
    cwd = cwd or Path.cwd()
    if target.module:
        top = target.script.split(".")[0]
        found = (cwd / top).is_dir() or (cwd / f"{top}.py").is_file() or importlib.util.find_spec(top) is not None
        if not found:
            raise AccelkitError(f"module `{target.script}` not found (nothing named `{top}` is importable here)",
                                hint="run from the directory that contains the package, or install it")
        return
    path = cwd / target.script
    if not path.exists():
        raise AccelkitError(f"script not found: {target.script}",
                            hint="check the path (relative to the current directory); use -m NAME to run a module")
    if not path.is_file():
        raise AccelkitError(f"not a file: {target.script}", hint="pass the training script itself, e.g. train.py")


def resolve_request(request: LaunchRequest, *, check_with_accelerate: bool = True) -> ResolvedConfig:
    """The job's config: the options on top of --config FILE (if any). `--cpu` with several processes and no
    backend means N data-parallel CPU processes (what `accelerate launch --cpu --num_processes N` users expect).
    `check_with_accelerate=False`: without Accelerate's own check (see configs.resolve_config)."""
    from accelkit.configs import load_accelerate_config, resolve_config

    options, labels = request.options, dict(request.source_labels)
    base = load_accelerate_config(request.config_file) if request.config_file is not None else None
    if request.config_file is not None and base is not None:  # a written config's gradient compression comment
        from accelkit.compression.launch_side import compression_with_config_comment

        options, labels = compression_with_config_comment(options, labels, request.config_file)
        from accelkit.configs import pipeline_with_config_comment

        options, labels = pipeline_with_config_comment(options, labels, request.config_file)
    several = (options.num_processes or 0) > 1 or (options.num_machines or 0) > 1
    if request.cpu and several and options.backend is None and options.preset is None and base is None:
        options, labels["backend"] = replace(options, backend=Backend.CPU.value), "--cpu"
    return resolve_config(options, base=base, base_label=str(request.config_file) if base is not None else None,
                          labels=labels, launch=True, per_machine=not request.for_cluster,
                          check_with_accelerate=check_with_accelerate)


def check_gpus(config: ResolvedConfig) -> None:
    """A GPU backend on a machine without (enough) GPUs would start ranks that never connect: refuse instead."""
    from accelkit.hardware import gpu_count

    available = gpu_count()
    per_machine = config.processes_per_machine
    if available == 0:
        source = config.source("backend")
        same = f"--config {source.label}" if source.from_file else f"--backend {config.backend.value}"
        raise AccelkitError(f"{config.said_backend()} runs on GPUs, and this machine has none",
                            hint=f"add --cpu to rehearse it on {per_machine} CPU "
                                 f"{'process' if per_machine == 1 else 'processes'} "
                                 f"(`accelkit launch --cpu {same} ...`)")
    if available < per_machine:
        raise AccelkitError(f"{per_machine} processes per machine need {per_machine} GPUs; this machine has "
                            f"{available}", hint=f"pass --num-processes {available * config.num_machines}")


def check_deepspeed() -> None:
    from accelkit.rehearsal import DEEPSPEED_INSTALL_HINT

    if importlib.util.find_spec("deepspeed") is None:
        raise AccelkitError("the config uses DeepSpeed, which is not installed", hint=DEEPSPEED_INSTALL_HINT)


def launcher_flags(request: LaunchRequest, config: ResolvedConfig) -> tuple[LauncherFlags, str]:
    """The launcher flags with this machine's values (rank, main address, port), and where the port came from."""
    flags = request.flags
    if not config.per_machine:  # the SLURM script fills rank, address and port on each node
        return flags.without_machine(), "sbatch script"
    port_source = str(config.source("main_process_port"))
    if config.num_machines > 1:
        return replace(flags, machine_rank=config.machine_rank, main_process_ip=config.main_process_ip,
                       main_process_port=config.main_process_port), port_source
    if config.main_process_port is not None:
        return replace(flags, main_process_port=config.main_process_port), port_source
    # One machine and no port asked for: pick a free one, so two jobs on one machine do not collide on 29500.
    return replace(flags, main_process_port=ports.free_port()), "free port"


def check_port(config: ResolvedConfig, flags: LauncherFlags, port_source: str) -> None:
    """The machine that hosts the rendezvous (the only one, or machine 0) must be able to listen on its port."""
    port = flags.main_process_port
    if port is None or (config.num_machines > 1 and config.machine_rank != 0) or ports.port_free(port):
        return
    raise AccelkitError(f"port {port} ({port_source}) is already in use on this machine, which hosts the rendezvous",
                        hint="pass another --main-process-port (the same on every machine), or stop what uses it")


def fsdp2_tp_workaround(config: ResolvedConfig) -> list[str]:
    """The rank module that lets FSDP2 x TP start where Accelerate imports what transformers removed
    (accelkit.ranks.fsdp2_tp_compat), for such a layout on such versions; else nothing."""
    p = config.parallelism
    fsdp2 = config.backend is Backend.FSDP and config.fsdp is not None and config.fsdp.version == 2
    if p is None or p.tp <= 1 or not fsdp2 or p.pipelined:
        return []
    from accelkit.package_files import fsdp2_tp_workaround_needed

    return [FSDP2_TP_MODULE] if fsdp2_tp_workaround_needed() else []


def prepare_launch(request: LaunchRequest, *, config_path: Path | None = None,
                   check_hardware: bool = True) -> PreparedLaunch:
    """Resolve everything about a launch. The config goes to `config_path`, or to a new temporary directory
    (returned as `temp_dir`). `check_hardware=False` (dry-run, SLURM) plans for another machine: no GPU,
    DeepSpeed or port checks here."""
    from accelkit.configs import write_deepspeed_json

    check_target(request.target)
    config = resolve_request(request)
    if config.pipeline_env():  # before anything is written: a script that ignores the layout is refused
        from accelkit.launch.preflight import check_pipeline_code

        check_pipeline_code(request.target, config.said("pp_size"))
    flags, port_source = launcher_flags(request, config)
    compression = None  # refused here (bf16 or int8 on CPU ranks) before anything is written
    if config.grad_compression is not None:
        from accelkit.compression.launch_side import compression_env_and_notes

        compression = compression_env_and_notes(config, request)
    # A DeepSpeed JSON asked for with --deepspeed-json must exist before the rehearsal reads it or a launcher runs.
    write_deepspeed_json(config)
    temp_dir = None
    if config_path is None:
        temp_dir = Path(tempfile.mkdtemp(prefix="accelkit-launch-"))
        config_path = temp_dir / "accelerate_config.yaml"
    try:
        return _prepare(request, config, flags, port_source, compression, config_path, temp_dir, check_hardware)
    except BaseException:
        if temp_dir is not None:
            import shutil

            shutil.rmtree(temp_dir, ignore_errors=True)
        raise


def with_load_universal(request: LaunchRequest, config: ResolvedConfig, json_path: Path) -> ResolvedConfig:
    """The config with a DeepSpeed JSON at `json_path` that adds `checkpoint: {load_universal: true}` to what the
    ranks would have run: the JSON the config names, or the one `--deepspeed-json` writes for inline settings."""
    import json

    settings = config.deepspeed
    if settings is not None and settings.json_file is not None:
        content = dict(settings.json_content or json.loads(Path(settings.json_file).read_text()))
    else:  # inline settings: the same options as a JSON file (what `accelkit config --deepspeed-json` writes)
        options = replace(request.options, deepspeed_json=json_path)
        config = resolve_request(replace(request, options=options))
        settings, content = config.deepspeed, dict(config.deepspeed.json_content or {})
    content["checkpoint"] = {**(content.get("checkpoint") or {}), "load_universal": True}
    from accelkit.configs import Source

    sources = {**config.sources, "deepspeed_json": Source.labelled("accelkit: the config + load_universal")}
    return replace(config, deepspeed=replace(settings, json_file=str(json_path), json_content=content),
                   sources=sources)


def _prepare(request: LaunchRequest, config: ResolvedConfig, flags: LauncherFlags, port_source: str, compression,
             config_path: Path, temp_dir: Path | None, check_hardware: bool) -> PreparedLaunch:
    from accelkit.configs import write_config, write_deepspeed_json

    target, resume = request.target, None
    if not request.for_cluster and config.backend is Backend.DEEPSPEED:
        # A ZeRO checkpoint of another world size: read now, converted to DeepSpeed's universal format (after the
        # checks below, not on a dry run) before any rank starts, and loaded by the ranks with load_universal.
        from accelkit.launch.zero_resume import RESUME_FLAG, plan_zero_resume, with_script_option

        resume = plan_zero_resume(target.args, Path(target.script).resolve(), config.num_processes,
                                  dry_run=not check_hardware)
        if resume is not None:
            config = with_load_universal(request, config, config_path.with_name("deepspeed-load-universal.json"))
            write_deepspeed_json(config)
            target = replace(target, args=with_script_option(target.args, RESUME_FLAG, str(resume.copy)))

    env: dict[str, str] = {}
    if config.backend is not Backend.DEEPSPEED and config.gradient_accumulation_steps is not None:
        env[ACCUMULATION_ENV] = str(config.gradient_accumulation_steps)  # Accelerator() reads it
    launch_config, rehearsal, bootstrap, notes = config, None, False, ()
    if request.cpu or config.runs_on_cpu:
        from accelkit.rehearsal import rehearse

        rehearsed = rehearse(config)
        launch_config, rehearsal, notes = rehearsed.config, rehearsed.backend, rehearsed.notes
        if not request.for_cluster:  # the ranks start here: refuse what this machine cannot hold
            from accelkit.launch.cpu_capacity import check_cpu_ranks

            notes = (*notes, *check_cpu_ranks(config.processes_per_machine))
        env.update(rehearsed.env)
        bootstrap = rehearsed.bootstrap  # ranks start in the bootstrap, which installs the shim
    elif check_hardware:
        if config.backend.needs_gpus:
            check_gpus(config)
        if config.backend is Backend.DEEPSPEED:
            check_deepspeed()
    if check_hardware:
        check_port(config, flags, port_source)
    if not (request.cpu or config.runs_on_cpu):  # NCCL flight recorder for GPU launches (launch.collective_debug)
        from accelkit.launch.collective_debug import gpu_debug_env

        env.update(gpu_debug_env())
    env.update(config.pipeline_env())  # the one place the ranks read the pipeline layout (configs/pipeline_spec.py)
    if compression is not None:  # the one place the ranks read it (accelkit.compression.compression_spec)
        env.update(compression[0])
        notes = (*notes, *compression[1])
    workaround = fsdp2_tp_workaround(config)
    if workaround:
        notes = (*notes, "FSDP2 x TP through accelkit's workaround (accelkit.ranks.fsdp2_tp_compat): this Accelerate "
                 "imports transformers' removed ReplicateParallel; each rank provides it and splits the model by its "
                 "TP plan over the tp mesh")
    # --rank-prefix: a probe that prefixes each line a rank prints
    probes = [*request.probes, *workaround, *([RANK_PREFIX_PROBE] if request.rank_prefix else [])]
    if probes:  # per-rank modules (bench, plan --measure, a workaround): ranks start in the bootstrap, GPUs too
        from accelkit.ranks import PROBES_ENV

        env[PROBES_ENV] = ",".join(probes)
        bootstrap = True

    write_config(launch_config, config_path, request.command_line, with_json=False)
    if resume is not None:
        if check_hardware:
            from accelkit.launch.zero_resume import make_universal_copy

            make_universal_copy(resume)
        notes = (resume.line, *notes)
    plan = plan_launch(launch_config, config_path, target, flags, python=sys.executable, env=env,
                       rehearsal=rehearsal, bootstrap=bootstrap, notes=notes)
    return PreparedLaunch(plan=plan, summary=summary_lines(request, config, plan, port_source=port_source),
                          temp_dir=temp_dir)
