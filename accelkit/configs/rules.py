"""The one rule set over a ResolvedConfig: combinations that cannot work (errors) or probably do not do what was
meant (warnings), each naming its config key and flag.

`accelkit config`, `accelkit launch` and `accelkit config --check` all run these rules, so one problem gets one
verdict and the same words everywhere. The words follow where each value came from (ResolvedConfig.said): a value
given as a flag is named as that flag (`--num-processes 3`), a value from a file by its key (`num_processes 3`),
and a default is called a default: a message never names a value the user did not give.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from accelkit.configs.choices import Backend, MixedPrecision, OffloadDevice, Sharding, StateDict, WrapPolicy
from accelkit.configs.findings import ERROR, WARNING, Finding, raise_first_error
from accelkit.configs.options import ConfigOptions, backend_group, config_key, flag_name
from accelkit.configs.resolved import DEFAULT, FLAG, ResolvedConfig
from accelkit.limits import MAX_ACCUMULATION_STEPS, MAX_MACHINES, MAX_PARAMS, MAX_PROCESSES


def _finding(code: str, severity: str, message: str, hint: str, option: str = "", **kwargs: Any) -> Finding:
    return Finding(code, severity, message, hint, key=config_key(option) if option else "",
                   flag=flag_name(option) if option else "", **kwargs)


def _named(cfg: ResolvedConfig, name: str) -> str:
    """How to call a setting: by its flag when the user gave that flag, else by its config key."""
    if cfg.given_by_flag(name):
        return flag_name(name)
    return config_key(name).rsplit(".", 1)[-1] or name


def _default_note(cfg: ResolvedConfig, name: str) -> str:
    return " by default" if cfg.source(name).kind == "default" else ""


# -- processes and machines -------------------------------------------------------------------------------------------
def _topology(cfg: ResolvedConfig) -> Iterator[Finding]:
    procs, machines, rank = cfg.num_processes, cfg.num_machines, cfg.machine_rank
    if procs < 1:
        yield _finding("processes-count", ERROR, f"{_named(cfg, 'num_processes')} must be at least 1 (got {procs})",
                       "use at least 1 process (--num-processes N, `num_processes: N` in a config file)",
                       "num_processes")
    for name, ceiling, what in (("num_processes", MAX_PROCESSES, "the total number of processes (GPUs) of the job"),
                                ("num_machines", MAX_MACHINES, "the number of machines of the job")):
        value = getattr(cfg, name)
        if value > ceiling:
            yield _finding(f"{name.split('_')[1]}-ceiling", ERROR, f"{_named(cfg, name)} {value:,} is more than any "
                           f"cluster has (the limit is {ceiling:,})", f"check {flag_name(name)}: {what}", name)
            return
    if machines < 1:
        yield _finding("machines-count", ERROR, f"{_named(cfg, 'num_machines')} must be at least 1 (got {machines})",
                       "use 1 for one machine (--num-machines 1)", "num_machines")
        return
    if not 0 <= rank < machines:
        yield _finding("machine-rank-range", ERROR, f"{cfg.said('machine_rank')} is outside 0..{machines - 1} for "
                       f"{machines} machine(s)", "machine ranks count from 0: the main machine is rank 0, the last "
                       "is the number of machines minus 1", "machine_rank")
    if cfg.backend is Backend.SINGLE and machines > 1:
        yield _finding("single-one-machine", ERROR, f"{cfg.said('backend')} runs one process on one machine, not "
                       f"{machines} machines", "use --backend ddp (or fsdp/deepspeed) for several machines", "backend")
    if procs >= 1 and procs % machines:
        yield _finding("processes-divisible", ERROR, f"{cfg.said('num_processes')} is not divisible by "
                       f"{cfg.said('num_machines')}", "the number of processes is the TOTAL across machines: use "
                       f"machines x processes per machine, e.g. {machines * -(-procs // machines)}", "num_processes")
    port = cfg.main_process_port
    if port is not None and not 1 <= port <= 65535:
        yield _finding("port-range", ERROR, f"{cfg.said('main_process_port')} is not a TCP port",
                       "use a free port in 1024..65535, e.g. 29500", "main_process_port")
    steps = cfg.gradient_accumulation_steps
    if steps is not None and steps < 1:
        yield _finding("accumulation-steps", ERROR, f"{_named(cfg, 'gradient_accumulation_steps')} must be at least "
                       f"1 (got {steps})", "use 1 for no accumulation", "gradient_accumulation_steps")
    elif steps is not None and steps > MAX_ACCUMULATION_STEPS:
        yield _finding("accumulation-steps", ERROR, f"{_named(cfg, 'gradient_accumulation_steps')} {steps:,} is "
                       f"beyond any real run (the limit is {MAX_ACCUMULATION_STEPS:,} steps per optimizer step)",
                       "check the count: a few to a few hundred steps are usual", "gradient_accumulation_steps")
    if cfg.backend is Backend.SINGLE and procs > 1:
        yield _finding("single-one-process", ERROR, f"{cfg.said('backend')} runs one process, not {procs}",
                       "use --backend ddp (or fsdp/deepspeed) for several processes", "backend")


def _cpu_limits(cfg: ResolvedConfig) -> Iterator[Finding]:
    """What needs a GPU, on a config that runs on CPU (the cpu backend, or a CPU rehearsal of a GPU backend)."""
    if not cfg.runs_on_cpu:
        return
    if cfg.mixed_precision is MixedPrecision.FP16:
        yield _finding("fp16-on-cpu", ERROR, f"{cfg.said('mixed_precision')}: fp16 mixed precision does not run on "
                       "CPU", "use bf16 (or no) on CPU: --mixed-precision bf16, `mixed_precision: bf16`; keep fp16 "
                       "for GPU runs", "mixed_precision")
    d = cfg.deepspeed
    for what, device, option in (("the optimizer", d and d.offload_optimizer, "offload_optimizer"),
                                 ("parameters", d and d.offload_params, "offload_params")):
        if device is OffloadDevice.NVME:
            yield _finding("nvme-on-cpu", ERROR, f"NVMe offload of {what} does not run on CPU (it needs DeepSpeed's "
                           "async-io op and a GPU)", "offload to cpu or none on CPU (--offload-optimizer cpu, "
                           "--offload-params cpu); keep nvme for GPU runs", option)
    p = cfg.parallelism
    if p is not None and p.cp > 1:
        # Measured on torch 2.13: context_parallel swaps only the flash, efficient and cuDNN SDPA kernels for ring
        # attention; none of them has a CPU kernel, and the CPU's own has no context-parallel rule.
        yield _finding("cp-on-cpu", ERROR, f"{cfg.said('cp_size')}: context parallelism does not run on CPU (torch's "
                       "context_parallel rewrites only the flash/efficient/cuDNN attention kernels, none of which "
                       "runs on CPU)", "rehearse the rest of the layout with --cp-size 1 on CPU; run CP on GPUs",
                       "cp_size")
    # Sequence parallelism (DeepSpeed Ulysses) runs on CPU ranks and gives the one-process losses
    # (tests/integration/test_nd_rehearsal.py): no finding.


def _multi_machine(cfg: ResolvedConfig) -> Iterator[Finding]:
    if cfg.num_machines > 1 and cfg.per_machine and not cfg.main_process_ip:
        yield _finding("main-address-missing", ERROR, f"{cfg.said('num_machines')} but no main_process_ip: the "
                       "other machines cannot find machine 0", "pass --main-process-ip ADDRESS (`main_process_ip:` in "
                       "a config file), the same on every machine", "main_process_ip")
    if cfg.num_processes == 1 and cfg.backend in (Backend.DDP, Backend.FSDP):
        kind = "DDP" if cfg.backend is Backend.DDP else "FSDP"
        yield _finding("one-process", WARNING, f"{kind} with one process: nothing is distributed",
                       "set the number of processes to the number of GPUs (or use --backend single, "
                       "`distributed_type: NO`, for one device)", "num_processes")
    mpirun = cfg.extra.get("mpirun_config")
    hostfile = mpirun.get("mpirun_hostfile") if isinstance(mpirun, dict) else None
    if cfg.distributed_type == "MULTI_CPU" and not hostfile:
        yield _finding("multi-cpu-one-process", WARNING, f"MULTI_CPU with {cfg.num_processes} processes and no "
                       "mpirun hostfile: `accelerate launch` starts ONE process", "for N real CPU ranks use "
                       "`accelkit launch --cpu --num-processes N`", "backend", accelerate_only=True)


# -- options that belong to one backend --------------------------------------------------------------------------------
def misplaced_options(cfg: ResolvedConfig, given: ConfigOptions, *, writes_file: bool) -> Iterator[Finding]:
    """Flags given for another backend than the one in use (they would be silently dropped)."""
    backend = cfg.backend
    named = {name for name, value in given.given().items() if value is not False}
    for group, owner in (("fsdp", Backend.FSDP), ("deepspeed", Backend.DEEPSPEED)):
        if backend is owner:
            continue
        misplaced = [name for name in given.__dataclass_fields__ if name in named and backend_group(name) == group]
        if misplaced:
            flag = flag_name(misplaced[0])
            what = "an FSDP" if group == "fsdp" else "a DeepSpeed"
            yield _finding("option-for-other-backend", ERROR, f"{flag} is {what} option, but the "
                           f"backend is {_backend_said(cfg)}", f"add --backend {owner.value}, or drop {flag}",
                           misplaced[0])
    if backend is not Backend.DEEPSPEED and writes_file and given.gradient_accumulation_steps is not None:
        yield _finding("accumulation-in-file", ERROR, "Accelerate config files store gradient accumulation only for "
                       f"DeepSpeed, not {backend.value}", "pass gradient_accumulation_steps=N to Accelerator(...) in "
                       "your script, or give --gradient-accumulation-steps to `accelkit launch` (it exports "
                       "ACCELERATE_GRADIENT_ACCUMULATION_STEPS)", "gradient_accumulation_steps")
    if backend not in (Backend.FSDP, Backend.DEEPSPEED) and given.offload:
        yield _finding("offload-backend", ERROR, f"--offload needs --backend fsdp or deepspeed (the backend is "
                       f"{_backend_said(cfg)})", "use --backend fsdp --offload or --backend deepspeed --zero-stage 3 "
                       "--offload", "offload")


def _backend_said(cfg: ResolvedConfig) -> str:
    source = cfg.source("backend")
    return cfg.backend.value if source.kind == "flag" else f"{cfg.backend.value} ({source})"


# -- FSDP and DeepSpeed ---------------------------------------------------------------------------------------------
def _fsdp(cfg: ResolvedConfig) -> Iterator[Finding]:
    f = cfg.fsdp
    if f is None:
        return
    if f.wrap_cls and f.wrap_policy not in (None, WrapPolicy.TRANSFORMER):
        yield _finding("wrap-cls-policy", ERROR, f"{_named(cfg, 'wrap_cls')} only applies to --wrap-policy "
                       f"transformer (the policy is {f.wrap_policy.value})", "drop --wrap-cls, or use --wrap-policy "
                       "transformer", "wrap_cls")
    if f.min_num_params is not None and f.wrap_policy is not WrapPolicy.SIZE:
        policy = f.wrap_policy.value if f.wrap_policy else "not set"
        yield _finding("min-params-policy", ERROR, f"{_named(cfg, 'min_num_params')} only applies to --wrap-policy "
                       f"size (the policy is {policy})", "drop --min-num-params, or use --wrap-policy size",
                       "min_num_params")
    if f.min_num_params is not None and f.min_num_params > MAX_PARAMS:
        yield _finding("min-params-count", ERROR, f"{_named(cfg, 'min_num_params')} {f.min_num_params:,} is more "
                       "parameters than any model has (the limit is 10 trillion)",
                       "pass a parameter count per wrapped unit, such as 100000000", "min_num_params")
    if f.min_num_params is not None and f.min_num_params < 1:
        yield _finding("min-params-count", ERROR, f"{_named(cfg, 'min_num_params')} must be at least 1",
                       "pass a parameter count such as 100000000", "min_num_params")
    if f.version == 2 and f.sharding is Sharding.NO:
        yield _finding("fsdp2-no-shard", ERROR, "FSDP2 has no NO_SHARD strategy",
                       "use --backend ddp (same thing, faster), or --fsdp-version 1", "sharding")
    if f.version == 2 and f.sharding is Sharding.HYBRID and cfg.num_machines < 2 and cfg.parallelism is None:
        yield _finding("fsdp2-hybrid-one-machine", ERROR, "--sharding hybrid with FSDP2 replicates across machines, "
                       "but there is only one machine", "use --sharding full on one machine, or set --num-machines; "
                       "--fsdp-version 1 keeps HYBRID_SHARD", "sharding")
    # Only when the user typed --wrap-policy transformer: as a default, or in a file (what `accelerate config` and
    # `accelkit init` write for Transformers models, which name their blocks in `_no_split_modules`), it is the
    # usual setting, and a warning about it was noise on every template's first launch.
    if f.wrap_policy is WrapPolicy.TRANSFORMER and not f.wrap_cls and cfg.source("wrap_policy").kind == FLAG:
        yield _finding("wrap-without-class", WARNING, "transformer wrap policy without a layer class: Accelerate "
                       "then wraps the model's `_no_split_modules` (Transformers models); any other model becomes ONE "
                       "FSDP unit, gathered whole in forward (no per-layer memory saving)", "name the block class: "
                       "--wrap-cls LlamaDecoderLayer (fsdp_transformer_layer_cls_to_wrap)", "wrap_cls")


def _deepspeed(cfg: ResolvedConfig) -> Iterator[Finding]:
    d = cfg.deepspeed
    if d is None or d.uses_json and d.json_content is None:
        return  # the settings live in a DeepSpeed JSON accelkit did not write (the reader checks it)
    stage = 2 if d.zero_stage is None else d.zero_stage
    stage_said = f"the stage is {stage}{_default_note(cfg, 'zero_stage')}"
    if d.offload_params not in (None, OffloadDevice.NONE) and stage < 3:
        yield _finding("offload-params-stage", ERROR, f"DeepSpeed offloads parameters only at ZeRO stage 3 "
                       f"({stage_said})", "use --zero-stage 3, or --offload-params none", "offload_params")
    if d.offload_optimizer not in (None, OffloadDevice.NONE) and stage == 0:
        yield _finding("offload-stage-0", ERROR, "ZeRO stage 0 cannot offload the optimizer",
                       "use --zero-stage 1 or higher, or --offload-optimizer none", "offload_optimizer")
    if d.zero3_save_16bit_model and stage < 3:
        yield _finding("save-16bit-stage", ERROR, f"{_named(cfg, 'zero3_save_16bit_model')} applies to ZeRO stage 3 "
                       f"only ({stage_said})", "use --zero-stage 3, or drop --zero3-save-16bit-model",
                       "zero3_save_16bit_model")
    uses_nvme = OffloadDevice.NVME in (d.offload_optimizer, d.offload_params)
    if uses_nvme and not d.nvme_path:
        yield _finding("nvme-needs-path", ERROR, "NVMe offload needs a directory to swap to",
                       "pass --nvme-path /local/nvme/dir (`offload_param_nvme_path:` in a config file)", "nvme_path")
    if d.nvme_path and not uses_nvme:
        yield _finding("nvme-path-unused", ERROR, f"{_named(cfg, 'nvme_path')} is set but nothing is offloaded to "
                       "nvme", "add --offload-optimizer nvme and/or --offload-params nvme, or drop --nvme-path",
                       "nvme_path")


# -- N-D parallelism (Accelerate's ParallelismConfig) -----------------------------------------------------------------
_ND_HINT = ("--backend fsdp (FSDP2) composes dp_replicate, dp_shard, tp and cp; --backend ddp takes tp alone; "
            "--backend deepspeed takes sp")


def _parallelism(cfg: ResolvedConfig) -> Iterator[Finding]:
    p = cfg.parallelism
    if p is None:
        return
    bad = [name for name, size in (("dp_replicate_size", p.dp_replicate), ("dp_shard_size", p.dp_shard),
                                   ("tp_size", p.tp), ("cp_size", p.cp), ("sp_size", p.sp), ("pp_size", p.pp))
           if size < 1]
    if bad:
        yield _finding("nd-size", ERROR, f"{cfg.said(bad[0])}: a parallelism size is at least 1", "use 1 for a "
                       "dimension you do not split", bad[0])
        return
    if p.cp > 1 and p.sp > 1:
        yield _finding("nd-cp-and-sp", ERROR, f"{cfg.said('cp_size')} and {cfg.said('sp_size')}: context and "
                       "sequence parallelism both split the sequence and cannot be combined",
                       "keep one: --cp-size N (FSDP2, torch) or --sp-size N (DeepSpeed Ulysses)", "sp_size")
        return
    pipeline = [*_pipeline(cfg, p), *_pp_options(cfg, p)]
    yield from pipeline
    if any(f.is_error for f in pipeline):
        return
    crossing = list(_nd_machines(cfg, p))
    yield from crossing
    if any(f.is_error for f in crossing):
        return
    leftover = list(_nd_leftover(cfg, p))
    if leftover:  # the backend's data-parallel size could not be filled: that, not what it was left at, is why
        yield from leftover
        return
    yield from _nd_backend(cfg, p)
    yield from _nd_product(cfg, p)


def _pipeline(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    """Pipeline parallelism (accelkit.configs.pipeline_spec): its settings without a pipeline, microbatches against the
    stages and the schedule, and what the templates compose it with (FSDP2's dp_shard and TP, on one mesh)."""
    from accelkit.pipeline_schedules import default_microbatches, microbatch_rule_break

    if p.pp == 1:
        for name in ("pp_schedule", "microbatches"):
            if cfg.given_by_flag(name):
                yield _finding("pp-unused", ERROR, f"{cfg.said(name)} applies to a pipeline, but there is none "
                               "(pp_size is 1)", f"add --pp-size 2 or more, or drop {flag_name(name)}", name)
        return
    # the one rule set of every command (accelkit.pipeline_schedules); 0 is "not given" inside, so a 0 the user said
    # is checked as said, not replaced by the default
    m = 0 if cfg.value("microbatches") == 0 else p.microbatches or default_microbatches(p.pp, p.pp_schedule)
    broken = microbatch_rule_break(p.pp, p.pp_schedule, m, said_microbatches=cfg.said("microbatches", m),
                                   said_schedule=cfg.said("pp_schedule", p.pp_schedule))
    if broken is not None:
        yield _finding("pp-microbatches", ERROR, broken.message, broken.hint, "microbatches")
        return
    said = cfg.said_backend()
    if cfg.backend is Backend.DEEPSPEED:
        yield _finding("pp-backend", ERROR, f"{cfg.said('pp_size')} with {said}: DeepSpeed's pipeline engine is not "
                       "reachable through Accelerate (its `pipeline` block has no effect)", "use --backend fsdp "
                       "--pp-size N (FSDP2 x PP), or --backend ddp --pp-size N for a pipeline alone", "pp_size")
        return
    other = next((n for n, size in (("cp_size", p.cp), ("sp_size", p.sp), ("dp_replicate_size", p.dp_replicate))
                  if size > 1), None)
    if other == "dp_replicate_size" and cfg.source(other).kind == DEFAULT:
        yield _finding("pp-compose", ERROR, f"{cfg.said('pp_size')} on {cfg.said('num_processes')} under {said} "
                       f"leaves {p.dp_replicate} replicas of the pipeline: replicated pipelines are not composed",
                       f"use --backend fsdp to shard over the other processes (dp_shard), or --num-processes "
                       f"{p.total // p.dp_replicate}", "pp_size")
        return
    if other is not None:
        yield _finding("pp-compose", ERROR, f"{cfg.said('pp_size')} with {cfg.said(other)}: the pipeline composes "
                       "with FSDP2 (dp_shard) and tensor parallelism (tp) only", f"drop {flag_name(other)}"
                       + (" and shard over --dp-shard-size under --backend fsdp" if other == "dp_replicate_size"
                          else ""), other)


# Options the pipeline loop (templates/causal-lm/pipeline_parallel.py) cannot apply: it shards its stages with
# fully_shard itself, outside Accelerate's prepare, and saves torch distributed checkpoints per stage. It applies
# --mixed-precision bf16 (autocast), --activation-checkpointing (each decoder layer) and --sharding (FSDP2's
# reshard_after_forward); the others would be dropped without a word, so they are refused.
PP_UNAPPLIED = {  # the reduce dtype and gradient compression: accelkit.compression.checks
    "offload": "the pipeline's stages are not offloaded (Accelerate's prepare does that)",
    "wrap_policy": "the pipeline shards each decoder layer as one FSDP2 unit (the transformer policy), whatever the "
                   "wrap policy",
    "wrap_cls": "the pipeline shards each decoder layer as one FSDP2 unit, whatever the wrap classes",
    "min_num_params": "the pipeline shards each decoder layer as one FSDP2 unit, whatever the size",
}
# The pipeline's own wrapping is the transformer policy: a config that states it (accelkit config writes it) says
# what the pipeline does; the classes or size a file carries beside it are unused, but only a flag given for this
# run asks for them.
PP_FILE_ONLY = ("wrap_cls", "min_num_params")


def _pp_options(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    """Options a pipeline layout would drop without a word: each refused, naming why."""
    if p.pp == 1:
        return
    for name, why in PP_UNAPPLIED.items():
        value = cfg.value(name)
        if cfg.source(name).kind == DEFAULT or value in (None, False, ()):
            continue
        if (name == "wrap_policy" and value == WrapPolicy.TRANSFORMER) or \
                (name in PP_FILE_ONLY and not cfg.given_by_flag(name)):
            continue
        said = flag_name(name) if value is True and cfg.given_by_flag(name) else cfg.said(name)
        yield _finding("pp-option", ERROR, f"{said} with {cfg.said('pp_size')}: {why}",
                       f"drop {flag_name(name)} (docs/guides/nd-parallelism.md lists what pipelines apply)", name)
    if cfg.value("state_dict") == StateDict.FULL and cfg.source("state_dict").kind != DEFAULT:
        yield _finding("pp-option", ERROR, f"{cfg.said('state_dict')} with {cfg.said('pp_size')}: the pipeline saves "
                       "each stage's shards (torch distributed checkpoint) and its final model as safetensors per "
                       "stage", "drop --state-dict full; `accelkit merge-ckpt` merges a pipeline checkpoint into one "
                       "file", "state_dict")
    if cfg.mixed_precision is MixedPrecision.FP16:
        yield _finding("pp-option", ERROR, f"{cfg.said('mixed_precision')} with {cfg.said('pp_size')}: fp16 needs a "
                       "loss scaler across the stages, which the pipeline does not have", "use --mixed-precision "
                       "bf16 (applied by autocast in every stage) or no", "mixed_precision")


def _pp_layers(cfg: ResolvedConfig, model_config: Any) -> Iterator[Finding]:
    """The pipeline's stages against the model's decoder layers: each stage holds one or more whole layers."""
    from accelkit.configs.model_heads import read_layers
    from accelkit.configs.pipeline_spec import stages_per_rank

    p = cfg.parallelism
    if p is None or p.pp <= 1:
        return
    layers = read_layers(model_config)
    per_rank = stages_per_rank(p.pp_schedule)
    stages = p.pp * per_rank
    if layers is not None and layers < stages:
        how = f" ({per_rank} per process with {cfg.said('pp_schedule', p.pp_schedule)})" if per_rank > 1 else ""
        yield _finding("pp-layers", ERROR, f"{cfg.said('pp_size')} makes {stages} pipeline stages{how}, but the model "
                       f"has {layers} decoder layers ({model_config}): each stage needs a whole layer",
                       (f"use a one-stage schedule (--pp-schedule 1f1b or gpipe), or --pp-size {layers // per_rank}"
                        if per_rank > 1 and layers >= p.pp else f"use --pp-size {layers} or less")
                       + ", or a model with more layers", "pp_size")


def _nd_leftover(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    """The backend's data-parallel dimension (FSDP's dp_shard, DDP's dp_replicate) was not given and takes the
    processes the other sizes leave, but they do not divide the processes: `--tp-size 3` on 8 processes."""
    rest = {Backend.FSDP: "dp_shard_size", Backend.DDP: "dp_replicate_size"}.get(cfg.backend)
    procs = cfg.num_processes
    if rest is None or cfg.source(rest).kind != DEFAULT or procs < 1:
        return
    given = {name: getattr(p, field) for name, field in (("pp_size", "pp"), ("dp_replicate_size", "dp_replicate"),
             ("dp_shard_size", "dp_shard"), ("tp_size", "tp"), ("cp_size", "cp"), ("sp_size", "sp"))
             if name != rest and getattr(p, field) > 1}
    others = 1
    for size in given.values():
        others *= size
    if others <= 1 or procs % others == 0:
        return
    named = " x ".join(cfg.said(name) for name in given)
    divisors = [d for d in range(2, min(procs, 64) + 1) if procs % d == 0][:6]
    example = f" ({', '.join(map(str, divisors))})" if divisors else ""
    main = next(iter(given))
    yield _finding("nd-divides", ERROR, f"{named} does not divide {cfg.said('num_processes')}: {cfg.said_backend()} "
                   f"gives {rest.removesuffix('_size')} the processes the other sizes leave, and {procs} / {others} "
                   "is not whole", f"use sizes that divide {procs}{example}, or give {flag_name(rest)} too", main)


def _nd_backend(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    """The layouts Accelerate composes for each backend, refused with Accelerate's reason."""
    backend, said = cfg.backend, cfg.said_backend()
    if backend in (Backend.SINGLE, Backend.CPU) and p.total > 1:
        yield _finding("nd-backend", ERROR, f"{said} cannot split a model ({p.describe()}): Accelerate refuses a "
                       "ParallelismConfig on plain CPU processes", f"{_ND_HINT} (add --cpu to rehearse on CPU)",
                       "backend")
    elif backend is Backend.FSDP and cfg.fsdp is not None and cfg.fsdp.version == 1 and p.total > 1:
        yield _finding("nd-fsdp1", ERROR, f"{p.describe()} needs FSDP2: {cfg.said('fsdp_version')} cannot compose "
                       "a device mesh", "use --fsdp-version 2", "fsdp_version")
    elif backend is Backend.DDP:
        if p.dp_shard > 1:
            yield _finding("nd-ddp-shard", ERROR, f"{cfg.said('dp_shard_size')} with {said}: DDP replicates, it "
                           "does not shard", "use --backend fsdp for dp_shard (or --dp-replicate-size for DDP)",
                           "dp_shard_size")
        elif p.cp > 1:
            yield _finding("nd-cp-backend", ERROR, f"{cfg.said('cp_size')} with {said}: context parallelism "
                           "needs FSDP2 (Accelerate shards the model over the cp dimension)",
                           "use --backend fsdp --cp-size N", "cp_size")
        elif p.sp > 1:
            yield _finding("nd-sp-backend", ERROR, f"{cfg.said('sp_size')} with {said}: sequence parallelism is "
                           "DeepSpeed's (Ulysses/ALST)", "use --backend deepspeed --sp-size N", "sp_size")
        elif p.tp > 1 and p.dp_replicate > 1:
            yield _finding("nd-ddp-tp", ERROR, f"{cfg.said('tp_size')} with {cfg.said('dp_replicate_size')}: "
                           "Accelerate does not compose DDP with tensor parallelism", "use --backend fsdp "
                           f"--dp-shard-size {p.dp_replicate} --tp-size {p.tp} (FSDP2 x TP), or --tp-size alone "
                           "over every process", "tp_size")
    elif backend is Backend.DEEPSPEED:
        other = next((n for n, size in (("tp_size", p.tp), ("cp_size", p.cp), ("dp_shard_size", p.dp_shard),
                                        ("dp_replicate_size", p.dp_replicate)) if size > 1), None)
        if other:
            yield _finding("nd-deepspeed", ERROR, f"{cfg.said(other)} with {said}: Accelerate composes only "
                           "sequence parallelism (--sp-size) with DeepSpeed; ZeRO does the data-parallel sharding",
                           f"drop {flag_name(other)} (or use --backend fsdp for tp/cp/dp_shard)", other)
    elif backend is Backend.FSDP:
        if p.sp > 1:
            yield _finding("nd-sp-backend", ERROR, f"{cfg.said('sp_size')} with {said}: sequence parallelism is "
                           "DeepSpeed's (Ulysses/ALST); FSDP2 splits the sequence with --cp-size",
                           "use --cp-size N with fsdp, or --backend deepspeed --sp-size N", "sp_size")
        elif (p.tp > 1 or p.cp > 1) and p.dp_replicate > 1 and p.dp_shard == 1:
            yield _finding("nd-replicate-needs-shard", ERROR, f"{cfg.said('dp_replicate_size')} with dp_shard 1 "
                           "under tp/cp: Accelerate composes TP/CP with FSDP (or HSDP), not with pure replication",
                           "give --dp-shard-size 2 or more (HSDP x TP), or move the replicas to --dp-shard-size",
                           "dp_shard_size")
        elif p.dp_shard == 1 and p.cp == 1 and p.pipelined:
            yield _finding("nd-nothing-to-shard", ERROR, f"{p.describe()} under {said} leaves FSDP nothing to "
                           "shard (dp_shard is 1)", "use --backend ddp for a pipeline alone, or more processes so "
                           "--dp-shard-size is 2 or more", "dp_shard_size")
        elif p.dp_shard == 1 and p.cp == 1:
            yield _finding("nd-nothing-to-shard", ERROR, f"{p.describe()} under {said} leaves FSDP nothing to "
                           f"shard (dp_shard and cp are 1): Accelerate refuses it", "lower --tp-size so "
                           "--dp-shard-size is 2 or more, or launch tensor parallelism alone with --backend ddp",
                           "dp_shard_size")
    for size, backend_name in (("cp", "cp_backend"), ("sp", "sp_backend")):
        if getattr(p, backend_name) is not None and getattr(p, size) == 1:
            yield _finding("nd-backend-unused", WARNING, f"{cfg.said(backend_name)} has no effect: {size}_size is "
                           "1", f"drop it, or set --{size}-size N", backend_name)


def _nd_product(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    procs = cfg.num_processes
    if cfg.backend is Backend.DEEPSPEED and p.sp > 1:
        if procs % p.sp:  # DeepSpeed builds its data-parallel groups from what sp leaves
            yield _finding("nd-product", ERROR, f"{cfg.said('sp_size')} does not divide "
                           f"{cfg.said('num_processes')}", "use an sp size that divides the number of processes",
                           "sp_size")
    elif p.total != procs and procs >= 1:
        sizes = " x ".join(f"{n} {s}" for n, s in p.sizes.items() if s > 1) or "1"
        others = p.total // max(p.dp_shard, 1)
        fix = f"--dp-shard-size {procs // others}" if cfg.backend is Backend.FSDP and procs % others == 0 else \
            f"sizes whose product is {procs}"
        yield _finding("nd-product", ERROR, f"the parallelism sizes ({sizes} = {p.total}) do not multiply to "
                       f"{cfg.said('num_processes')}", f"use {fix} ({'pp x ' if p.pp > 1 else ''}dp_replicate x "
                       "dp_shard x tp x cp x sp = processes)", "num_processes")
        return


def _nd_machines(cfg: ResolvedConfig, p: Any) -> Iterator[Finding]:
    """TP and CP groups are neighbouring ranks (innermost in the mesh): they must fit in one machine."""
    per_machine = cfg.processes_per_machine
    inner = p.tp * p.cp
    if inner > 1 and cfg.num_machines > 1 and per_machine % inner:
        what = "tensor-parallel" if p.cp == 1 else "tensor/context-parallel" if p.tp > 1 else "context-parallel"
        yield _finding("nd-cross-machine", ERROR, f"{what} groups of {inner} processes would span machines "
                       f"({per_machine} per machine): every layer's all-reduce would cross the network",
                       f"keep tp x cp within a machine: a divisor of {per_machine} (or fewer processes per group)",
                       "tp_size" if p.tp > 1 else "cp_size")
    elif inner > per_machine and cfg.num_machines > 1:
        yield _finding("nd-cross-machine", ERROR, f"tensor/context-parallel groups of {inner} processes exceed the "
                       f"{per_machine} processes of a machine: every layer's all-reduce would cross the network",
                       f"keep tp x cp at most {per_machine}", "tp_size" if p.tp > 1 else "cp_size")
    elif p.sp > per_machine and cfg.num_machines > 1:
        yield _finding("nd-sp-cross-machine", WARNING, f"{cfg.said('sp_size')} spans machines ({per_machine} "
                       "processes each): Ulysses' all-to-all per layer then crosses the network",
                       f"keep --sp-size at most {per_machine} where you can", "sp_size")


def _tp_heads(cfg: ResolvedConfig, model_config: Any) -> Iterator[Finding]:
    """Tensor parallelism against the model's attention heads (accelkit/configs/model_heads.py)."""
    from accelkit.configs.model_heads import read_heads, tp_heads_problem

    p = cfg.parallelism
    if p is None or p.tp <= 1:
        return
    heads = read_heads(model_config)
    problem = tp_heads_problem(p.tp, heads) if heads is not None else None
    if problem is not None:
        hint = problem[1].replace("a tp size", "a --tp-size", 1)
        if str(model_config).endswith(".py"):  # read from the config the script builds in code
            hint += f" (if {model_config} trains another model, name its config with --model-config PATH)"
        yield _finding("tp-heads", ERROR, f"{cfg.said('tp_size')} {problem[0]} ({model_config})", hint, "tp_size")


def _installed(cfg: ResolvedConfig, severity: str) -> Iterator[Finding]:
    """The layout needs what the installed packages lack (compat.py): one line with the versions that work."""
    p = cfg.parallelism
    if p is None or p.total <= 1 or p.pipelined:  # a pipeline's mesh is torch's own, not Accelerate's preparation
        return
    from accelkit.configs.compat import gaps

    fsdp2 = cfg.backend is Backend.FSDP and cfg.fsdp is not None and cfg.fsdp.version == 2
    for gap in gaps(fsdp2=fsdp2, tp=p.tp, cp=p.cp, sp=p.sp):
        yield _finding("nd-versions", severity, gap.message, gap.hint, "tp_size" if "TP" in gap.layout else "")


def refuse_rule_errors(cfg: ResolvedConfig) -> None:
    """The config's first rule error as an AccelkitError (`accelkit config`'s words); warnings pass."""
    raise_first_error(check_rules(cfg), more=None)


def check_rules(cfg: ResolvedConfig, given: ConfigOptions | None = None, *, writes_file: bool = True,
                installed_matters: bool | None = None) -> list[Finding]:
    """Every finding for `cfg`, errors in the order a user should fix them. `given`: the options the user typed
    (to name flags given for another backend); `writes_file`: the config goes to a file (`accelkit config`), where
    some settings have no key, rather than to a launch. `installed_matters`: the layout runs here, so what the
    installed packages lack is an error (default: yes, except for `accelkit config` writing a file, which may be for
    another machine: there it is a warning)."""
    if installed_matters is None:
        installed_matters = not (given is not None and writes_file)
    found = [*_topology(cfg), *_cpu_limits(cfg)]
    if given is not None:
        found += misplaced_options(cfg, given, writes_file=writes_file)
    layout = list(_parallelism(cfg))
    if not any(f.is_error for f in layout) and given is not None and given.model_config is not None:
        layout += _tp_heads(cfg, given.model_config)
        layout += _pp_layers(cfg, given.model_config)
    if not any(f.is_error for f in layout):
        layout += _installed(cfg, ERROR if installed_matters else WARNING)
    return [*found, *_fsdp(cfg), *_deepspeed(cfg), *layout, *_multi_machine(cfg)]
