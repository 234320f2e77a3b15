"""`run_plan(PlanRequest) -> CommandResult`: the command line's values in, the plan out (text lines or JSON, files
written, measurement); `plan_memory(PlanRequest) -> PlanResult` is the same plan as data, for tools (the GPU truth
benchmark reads its JSON).

Everything the user gave is checked here, before anything heavy runs or any file is written: sizes and counts
parse strictly, the model resolves, the hardware and batch add up, --write-config does not clobber a file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.plan.inputs import Hardware, Training, check_hardware, check_sizes, check_training
from accelkit.plan.models import ShapeFlags, resolve_model
from accelkit.plan.recommend import Recommendation
from accelkit.sizes import format_bytes, parse_bytes, parse_count

DEFAULT_SEQ_LEN = 2048


@dataclass(frozen=True)
class PlanRequest:
    """Everything `accelkit plan` is given, typed; the defaults are the command's."""

    model: str | None = None  # a folder, config.json, Hub id or accelkit project; None with params or shape flags
    params: str | None = None  # "7B", "1.3e9": planned as the Llama shape of that size
    shape: ShapeFlags = field(default_factory=ShapeFlags)  # --layers --hidden --heads --kv-heads --vocab --intermediate
    gpus: int | None = None  # --num-processes
    nodes: int = 1  # --num-machines
    gpu_memory: str | None = None  # "80GB", "24GiB" (accelkit.sizes)
    cpu_memory: str | None = None
    precision: str = "bf16-mixed"  # the planner's precision (commands/plan.py maps --mixed-precision onto it)
    optimizer: str = "adamw"
    seq_len: int | None = None
    micro_batch: int | None = None
    activation_checkpointing: bool = False
    global_batch: int | None = None
    base_lr: float | None = None
    base_batch: int | None = None
    strategy: str | None = None
    prefer: str = "any"
    write_config: Path | None = None
    force: bool = False
    measure_script: str | None = None
    script_args: tuple[str, ...] = ()
    command_line: str = "accelkit plan"  # the command that reproduces the plan, for a written config's header
    stall_timeout: float | None = None
    grad_compression: str | None = None
    powersgd_rank: int | None = None
    powersgd_start_step: int | None = None
    interconnect: str | None = None
    layout: str | None = None
    pp_schedule: str | None = None
    microbatches: int | None = None
    as_json: bool = False  # the CommandResult carries the JSON instead of the table


@dataclass
class PlanResult:
    lines: list[str]
    json: dict[str, Any]
    messages: list[str] = field(default_factory=list)  # for stderr
    exit_code: int = 0


def hardware_from(gpus: int | None, nodes: int, gpu_memory: int | None, cpu_memory: int | None,
                  given: dict[str, str]) -> Hardware:
    """Hardware from the flags, this machine filling what is missing (`given`: the flags' text, for the output)."""
    from accelkit.hardware import local_gpus, local_memory

    sources: dict[str, str] = {}
    if gpus is not None:
        check_hardware(gpus, nodes)
    # Explicit hardware (--num-processes, --gpu-memory) is planned as given; only missing values come from this machine.
    local = local_gpus() if gpus is None or gpu_memory is None else None
    if gpus is None:
        if not local.count and nodes > 1:
            raise AccelkitError(f"--num-machines {nodes} needs --num-processes (the total over all machines): this "
                                "machine has no GPU to count",
                                hint=f"e.g. --num-processes {8 * nodes} for {nodes} machines of 8 GPUs")
        gpus = local.count * nodes if local.count else 1
        sources["gpus"] = f"this machine's {local.count} GPU(s) x {nodes}" if local.count else "default: 1"
    else:
        sources["gpus"] = "--num-processes"
    if gpu_memory is not None:
        sources["gpu_memory"] = f"--gpu-memory {given['gpu_memory']}"
    elif local.count:
        gpu_memory = local.memory
        sources["gpu_memory"] = f"detected: {local.name}"
    else:
        raise AccelkitError("this machine has no GPU to read the memory of, and --gpu-memory was not given",
                            hint="give the memory of each GPU you plan for, e.g. --gpu-memory 80GB or "
                                 "--gpu-memory 24GiB")
    if cpu_memory is not None:
        sources["cpu_memory"] = f"--cpu-memory {given['cpu_memory']}"
    elif local is not None and local.count:
        cpu_memory = local_memory()
        sources["cpu_memory"] = "this machine's RAM"
    return Hardware(gpus=gpus, nodes=nodes, gpu_memory=gpu_memory, cpu_memory=cpu_memory, sources=sources)


def training_from(spec, precision: str, optimizer: str, seq_len: int | None, micro_batch: int | None,
                  activation_checkpointing: bool, global_batch: int | None, base_lr: float | None,
                  base_batch: int | None) -> Training:
    sources = {}
    if seq_len is None:
        seq_len = spec.seq_len or DEFAULT_SEQ_LEN
        sources["seq_len"] = "the project's default" if spec.seq_len else f"default {DEFAULT_SEQ_LEN}"
    if micro_batch is None:
        micro_batch = spec.micro_batch or 1
        sources["micro_batch"] = "the project's default" if spec.micro_batch else "default 1"
    training = Training(precision=precision, optimizer=optimizer, seq_len=seq_len, micro_batch=micro_batch,
                        activation_checkpointing=activation_checkpointing, global_batch=global_batch,
                        base_lr=base_lr, base_batch=base_batch, sources=sources)
    check_training(training)
    if spec.max_positions is not None and training.seq_len > spec.max_positions and spec.sequence_input:
        given = "--seq-len" if "seq_len" not in sources else "the sequence length"
        raise AccelkitError(f"{given} {training.seq_len} is beyond the model's max_position_embeddings "
                            f"{spec.max_positions} (its config): it was not built for sequences that long",
                            hint=f"use --seq-len {spec.max_positions} or less, or plan a config with a longer "
                                 "context (a larger max_position_embeddings, with its rope scaling)")
    return training


@contextlib.contextmanager
def no_empty_inductor_folder():
    """Importing transformers imports torch._dynamo, which creates `<temp>/torchinductor_<user>` at import time
    (its compile cache; the plan compiles nothing): remove it again when this plan created it and left it empty."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        yield
        return
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}"
    folder = Path(tempfile.gettempdir()) / ("torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))
    existed = folder.exists()
    try:
        yield
    finally:
        if not existed:
            with contextlib.suppress(OSError):  # not empty (something compiled there), or gone: leave it
                for sub in sorted(folder.rglob("*"), reverse=True):
                    sub.rmdir()
                folder.rmdir()
            if os.environ.get("TORCHINDUCTOR_CACHE_DIR") == str(folder):
                del os.environ["TORCHINDUCTOR_CACHE_DIR"]  # torch set it to the folder it made


def plan_memory(request: PlanRequest) -> PlanResult:
    """The plan as data: its lines, its JSON, what it says on stderr."""
    values = {field.name: getattr(request, field.name) for field in dataclasses.fields(request)
              if field.name != "as_json"}
    with no_empty_inductor_folder():
        return _run_plan(**values)


def run_plan(request: PlanRequest) -> CommandResult:
    """`accelkit plan` as one call: the table (or with `as_json` the JSON) on stdout, notes on stderr."""
    import json

    plan = plan_memory(request)
    result = CommandResult(exit_code=plan.exit_code)
    if request.as_json:
        result.out(json.dumps(plan.json, indent=2))
    else:
        for line in plan.lines:
            result.out(line)
    for line in plan.messages:
        result.err(line)
    return result


def _run_plan(*, model: str | None, params: str | None, shape: ShapeFlags, gpus: int | None, nodes: int,
             gpu_memory: str | None, cpu_memory: str | None, precision: str, optimizer: str, seq_len: int | None,
             micro_batch: int | None, activation_checkpointing: bool, global_batch: int | None,
             base_lr: float | None, base_batch: int | None, strategy: str | None, prefer: str,
             write_config: Path | None, force: bool, measure_script: str | None, script_args: tuple[str, ...],
             command_line: str, stall_timeout: float | None = None, grad_compression: str | None = None,
             powersgd_rank: int | None = None, powersgd_start_step: int | None = None,
             interconnect: str | None = None, layout: str | None = None, pp_schedule: str | None = None,
             microbatches: int | None = None) -> PlanResult:
    # Cheap checks first: every bad value is reported before torch is imported, the model built or a file written.
    given_layout = None
    if layout is not None:
        from accelkit.plan import layout_option

        given_layout = layout_option.parse_layout_option(layout, pp_schedule, microbatches)
        gpus = layout_option.check_world(given_layout, gpus, nodes)
        if strategy is not None:
            raise AccelkitError("--strategy and --layout both name what to plan", hint="give one of them")
    elif pp_schedule is not None or microbatches is not None:
        given = "--pp-schedule" if pp_schedule is not None else "--microbatches"
        raise AccelkitError(f"{given} needs a pipeline: give --layout with pp=N",
                            hint='e.g. --layout "dp_shard=8,tp=8,pp=8"')
    count = parse_count(params, "--params") if params is not None else None
    gpu_bytes = parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory is not None else None
    cpu_bytes = parse_bytes(cpu_memory, "--cpu-memory") if cpu_memory is not None else None
    check_sizes(count, gpu_bytes, cpu_bytes, {"params": params, "gpu_memory": gpu_memory, "cpu_memory": cpu_memory})
    if gpus is not None:
        check_hardware(gpus, nodes)
    check_training(Training(seq_len=1 if seq_len is None else seq_len,
                            micro_batch=1 if micro_batch is None else micro_batch, global_batch=global_batch,
                            base_lr=base_lr, base_batch=base_batch))
    from accelkit.compression.compression_spec import from_options
    from accelkit.compression.plan_comm import apply_compression, parse_interconnect

    compression = from_options(grad_compression, powersgd_rank, powersgd_start_step)  # gradient compression (issue 35)
    link = parse_interconnect(interconnect) if interconnect is not None else None
    if write_config is not None:
        from accelkit.fsio import refuse_overwrite

        refuse_overwrite(write_config, force)
    if measure_script is not None and not Path(measure_script).is_file():
        raise AccelkitError(f"script not found: {measure_script}", hint="--measure takes the training script to "
                                                                       "run, e.g. --measure train.py")
    for name, value in shape.given().items():
        if value < 1:
            raise AccelkitError(f"--{name.replace('_', '-')} {value} must be at least 1",
                                hint="shape flags describe a model: positive whole numbers")
    hardware = hardware_from(gpus, nodes, gpu_bytes, cpu_bytes, {"gpu_memory": gpu_memory, "cpu_memory": cpu_memory})
    spec = resolve_model(model, shape, count)
    training = training_from(spec, precision, optimizer, seq_len, micro_batch, activation_checkpointing,
                             global_batch, base_lr, base_batch)

    from accelkit.plan import report
    from accelkit.plan.planner import make_plan

    plan = make_plan(spec, hardware, training, prefer=prefer, strategy=strategy)
    if given_layout is None and strategy is None and _needs_more(plan) and not training.activation_checkpointing \
            and plan.hardware.gpu_memory is not None:
        # the cheaper remedy first: activation checkpointing, before sharding the model further or offloading it
        checkpointed = make_plan(spec, hardware, dataclasses.replace(training, activation_checkpointing=True),
                                 prefer=prefer, shape=plan.shape)
        plain = [r for r in plan.rows if r.unavailable is None and not r.strategy.offload]
        if plain:
            best = min(plain, key=lambda r: r.total)
            then = "" if not _needs_more(checkpointed) else \
                "; with it still no data-parallel strategy fits on the GPUs alone"
            checkpointed.notes.insert(0, f"activation checkpointing added (the cheaper remedy, before sharding or "
                                         f"offload): without it the smallest option, {best.strategy.label}, needs "
                                         f"{format_bytes(best.total)} per GPU{then}")
        plan = checkpointed
    from accelkit.plan.nd_report import nd_section

    layout_lines: list[str] = []
    section = nd_section(plan, given_layout) if given_layout is not None or _needs_more(plan) else None
    if section is not None:  # the layouts that split the model, the sequence or the layers
        layout_lines, layout_json, advice = section
        if given_layout is not None or advice.best is not None:  # one recommendation across every layout
            plan.layout_choice = advice
            plan.recommendation = Recommendation(None, advice.reason)
    compression_json = apply_compression(plan, compression, link) if compression.active or link else None
    plan.compression = compression if compression.active else None
    script = measure_script or (str(spec.script) if spec.script else None)
    config_path = str(write_config) if write_config is not None else None
    result = PlanResult(lines=report.text(plan, config_path, script, layout_lines),
                        json=report.to_json(plan, config_path, script))
    if compression_json is not None:
        result.json["grad_compression"] = compression_json
    if section is not None:
        result.json["nd"] = layout_json
    if write_config is not None:
        _write(plan, write_config, command_line, result, compression, force)
    if measure_script is not None:
        _measure(plan, spec, measure_script, script_args, command_line, result, stall_timeout)
    return result


def _needs_more(plan) -> bool:
    """Nothing data-parallel fits on the GPUs alone: no recommendation, or only offload."""
    return plan.chosen is None or plan.chosen.strategy.offload


def _write(plan, path: Path, command_line: str, result: PlanResult, compression, force: bool) -> None:
    from accelkit.compression.plan_config import options_with_compression
    from accelkit.plan import spine

    chosen = plan.chosen
    choice = plan.layout_choice
    if choice is not None:
        layout = (choice.best or choice.rows[0]).layout
        checkpointing = bool(result.json.get("nd", {}).get("checkpointing"))
        options = spine.layout_options(layout, plan.hardware, plan.training, checkpointing)
        spine.write_config_file(options, path, command_line, force)
        result.messages.append(f"Wrote {path} ({layout.describe()}, {plan.hardware.gpus} process(es)).")
        result.json["written_config"] = str(path)
        return
    if chosen is None:
        raise AccelkitError("nothing fits, so there is no config to write", hint=plan.recommendation.reason)
    options = spine.config_options_for(chosen.strategy, plan.hardware, plan.training, chosen.accumulation)
    options = options_with_compression(options, chosen.strategy, compression, path)  # issue 35
    also = spine.write_config_file(options, path, command_line, force)
    result.messages.append(f"Wrote {path}" + (f" and {also}" if also else "") +
                           f" ({chosen.strategy.label}, {plan.hardware.gpus} process(es)).")
    result.json["written_config"] = str(path)


def _measure(plan, spec, script: str, args: tuple[str, ...], command_line: str, result: PlanResult,
             stall_timeout: float | None = None) -> None:
    from accelkit.plan import spine
    from accelkit.plan.measure import measuring

    chosen = plan.chosen
    if plan.layout_choice is not None:
        raise AccelkitError("the plan is of an N-D or pipeline layout: --measure rehearses data-parallel strategies",
                            hint="measure one with --strategy NAME, or run the printed launch command")
    if chosen is None:
        raise AccelkitError("nothing fits, so there is no launch to measure",
                            hint="pick one with --strategy NAME to measure it anyway")
    from accelkit.hardware import local_gpus

    cpu = local_gpus().count == 0  # no GPU here: rehearse the launch on CPU processes
    if cpu and chosen.strategy.sharding == "hybrid":
        raise AccelkitError("a CPU rehearsal runs on one machine, and hybrid sharding needs 2 or more",
                            hint="measure --strategy fsdp-full instead; it holds the same per-GPU shard sizes "
                                 "within a node")
    options = spine.config_options_for(chosen.strategy, plan.hardware, plan.training, chosen.accumulation)
    planner = _activations_planner(spec, plan, "cpu" if cpu else "cuda")
    comparisons = measuring.measure(options, script, args, cpu=cpu, precision=plan.training.precision,
                                    optimizer=plan.training.optimizer, activations_planner=planner,
                                    planned_peak=None if cpu else chosen.total, command_line=command_line,
                                    stall_timeout=stall_timeout)
    where = "CPU rehearsal" if cpu else "GPUs"
    result.lines += ["", f"Measured: {script}, one optimizer step, {chosen.strategy.label} on "
                         f"{plan.hardware.gpus} rank(s) ({where}); bytes per rank:", *measuring.table(comparisons)]
    states = measuring.worst(comparisons, ("parameters", "gradients", "optimizer"))
    activations = measuring.worst(comparisons, ("activations",))
    result.lines.append(f"worst error: model states {states * 100:.2f}%, activations {activations * 100:.2f}%")
    result.json["measurement"] = {
        "script": script, "strategy": chosen.strategy.name, "device": "cpu" if cpu else "cuda",
        "ranks": [{"rank": c.rank, "model": c.model, "gpu_peak_bytes": c.peak,
                   "figures": {f.name: {"planned": f.planned, "measured": f.measured, "error": f.error}
                               for f in c.figures}} for c in comparisons],
        "worst_error": {"model_states": states, "activations": activations}}


def _activations_planner(spec, plan, device: str):
    """Plan a rank's activations for the batch its first forward saw, with the device's kernels."""
    if spec.build is None:
        return None
    from accelkit.plan.activations.trace import trace
    from accelkit.plan.planner import compute_for

    def planned(record: dict[str, Any]) -> int | None:
        if sum(math.prod(shape) for _, shape, _ in record["shapes"]) != plan.shape.parameters:
            return None  # the script trained another model than MODEL: its activations are not planned
        inputs = (record.get("inputs") or {}).get("shapes") or {}
        first = next(iter(inputs.values()), None)
        if not first:
            return None
        micro_batch = first[0]
        seq_len = first[1] if len(first) > 1 and spec.sequence_input else plan.training.seq_len
        family = {"deepspeed": "deepspeed", "fsdp": "fsdp"}.get(record["backend"], "torch")
        checkpointed = bool((record.get("inputs") or {}).get("checkpointed"))
        return trace(spec, compute_for(family, plan.training.precision), micro_batch, seq_len, checkpointed,
                     device=device).activations

    return planned
