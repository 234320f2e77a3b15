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

from accelkit.configs.choices import Backend, MixedPrecision, OffloadDevice, Sharding, WrapPolicy
from accelkit.configs.findings import ERROR, WARNING, Finding
from accelkit.configs.options import ConfigOptions, backend_group, config_key, flag_name
from accelkit.configs.resolved import ResolvedConfig


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
    if f.min_num_params is not None and f.min_num_params < 1:
        yield _finding("min-params-count", ERROR, f"{_named(cfg, 'min_num_params')} must be at least 1",
                       "pass a parameter count such as 100000000", "min_num_params")
    if f.version == 2 and f.sharding is Sharding.NO:
        yield _finding("fsdp2-no-shard", ERROR, "FSDP2 has no NO_SHARD strategy",
                       "use --backend ddp (same thing, faster), or --fsdp-version 1", "sharding")
    if f.version == 2 and f.sharding is Sharding.HYBRID and cfg.num_machines < 2:
        yield _finding("fsdp2-hybrid-one-machine", ERROR, "--sharding hybrid with FSDP2 replicates across machines, "
                       "but there is only one machine", "use --sharding full on one machine, or set --num-machines; "
                       "--fsdp-version 1 keeps HYBRID_SHARD", "sharding")
    if f.wrap_policy is WrapPolicy.TRANSFORMER and not f.wrap_cls:
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


def check(cfg: ResolvedConfig, given: ConfigOptions | None = None, *, writes_file: bool = True) -> list[Finding]:
    """Every finding for `cfg`, errors in the order a user should fix them. `given`: the options the user typed
    (to name flags given for another backend); `writes_file`: the config goes to a file (`accelkit config`), where
    some settings have no key, rather than to a launch."""
    found = [*_topology(cfg), *_cpu_limits(cfg)]
    if given is not None:
        found += misplaced_options(cfg, given, writes_file=writes_file)
    return [*found, *_fsdp(cfg), *_deepspeed(cfg), *_multi_machine(cfg)]


def problems(config: dict, deepspeed_json: dict | None = None, relative_to: Any = None) -> list[Finding]:
    """All findings for an Accelerate config dict as it is (what `accelkit config --check` reports for a file,
    apart from Accelerate's own loader)."""
    from accelkit.configs.reader import read_config

    resolved, found = read_config(config, relative_to=relative_to, json_content=deepspeed_json)
    if resolved is not None:
        found = found + check(resolved)
    return found
