"""What each backend can do with a gradient-compression choice: a refusal in one line, or the spec to apply.

    ddp (and cpu's plain CPU DDP)  fp16 / bf16 / powersgd: a DDP communication hook (Accelerate's
                                   DistributedDataParallelKwargs); int8: no (DeepSpeed ZeRO++ only)
    fsdp (v2)                      fp16 / bf16: FSDP2's MixedPrecisionPolicy(reduce_dtype=...); powersgd: no (a DDP
                                   hook: FSDP reduce-scatters shards, there is no bucket to factorize)
    deepspeed                      int8 at ZeRO stage 3: ZeRO++ (quantized weights and gradients, hpZ across
                                   machines) in the DeepSpeed JSON; other methods: no (DeepSpeed's own JSON key
                                   communication_data_type)

Facts measured on torch 2.13 CPU (gloo): torch's bf16_compress_hook refuses gloo at registration ("BF16 all reduce
communication hook required CUDA 11+ and NCCL 2.10+ or XPU and XCCL"), so bf16 under DDP is refused on CPU ranks;
ZeRO++'s quantization kernels are CUDA-only, so int8 is written and validated on CPU but never rehearsed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from accelkit.compression.compression_spec import NONE, CompressionSpec, from_options
from accelkit.errors import AccelkitError

GLOO_BF16 = ("torch's bf16_compress_hook refuses gloo (it needs CUDA 11+ and NCCL 2.10+, or XPU and XCCL), so a CPU "
             "run cannot use it")


def spec_of_options(options: Any) -> CompressionSpec:
    """The spec ConfigOptions ask for: --grad-compression (+ PowerSGD settings) and FSDP's --reduce-dtype."""
    spec = from_options(options.grad_compression, options.powersgd_rank, options.powersgd_start_step)
    reduce_dtype = options.reduce_dtype
    if reduce_dtype is None:
        return spec
    as_method = "none" if reduce_dtype == "fp32" else reduce_dtype
    if options.grad_compression is not None and spec.method != as_method:
        raise AccelkitError(f"--reduce-dtype {reduce_dtype} contradicts --grad-compression {spec.method}",
                            hint="give one of them: under FSDP, --grad-compression bf16 is --reduce-dtype bf16")
    return CompressionSpec(as_method)


def check_backend(spec: CompressionSpec, cfg: Any, *, reduce_dtype_given: bool = False) -> CompressionSpec:
    """Refuse what `cfg`'s backend cannot do with `spec` (AccelkitError, one line + hint); the spec to apply."""
    backend = cfg.backend.value
    if reduce_dtype_given and backend != "fsdp":
        raise AccelkitError(f"--reduce-dtype is FSDP2's reduce dtype, but the backend is {backend}",
                            hint="add --backend fsdp, or use --grad-compression for ddp/deepspeed")
    if not spec.active:
        return NONE
    flag = f"--grad-compression {spec.method}"
    pipeline = getattr(cfg.parallelism, "pp", 1)  # None: no layout
    if pipeline > 1:  # the template's pipeline loop shards its stages itself: nothing would apply it
        said = f"--reduce-dtype {spec.method}" if reduce_dtype_given else flag
        raise AccelkitError(f"{said} with a pipeline (pp {pipeline}): the pipeline's stages run in the template's "
                            "own loop, outside Accelerate's prepare (no DDP hook, no FSDP2 policy), so nothing would "
                            "apply it",
                            hint=f"drop {said.split()[0]} under --pp-size (docs/guides/nd-parallelism.md lists what "
                                 "pipelines apply)")
    if cfg.num_processes < 2:
        raise AccelkitError(f"{flag} on one process: there is no gradient communication to compress",
                            hint="use 2 or more processes (--num-processes N), or drop --grad-compression")
    if backend in ("ddp", "cpu"):
        _check_ddp(spec, cfg, flag)
    elif backend == "fsdp":
        _check_fsdp(spec, cfg, flag)
    elif backend == "deepspeed":
        _check_deepspeed(spec, cfg, flag)
    else:
        raise AccelkitError(f"{flag}: the {backend} backend has no gradient communication",
                            hint="use --backend ddp, fsdp or deepspeed with 2 or more processes")
    return spec


def _check_ddp(spec: CompressionSpec, cfg: Any, flag: str) -> None:
    if spec.method == "int8":
        raise AccelkitError(f"{flag}: DDP has no maintained int8 gradient path (torch's quantization hooks are "
                            "experimental and CUDA-only)", hint="int8 is DeepSpeed ZeRO++: --backend deepspeed "
                            "--zero-stage 3 --deepspeed-json ds.json; under DDP use fp16, bf16 or powersgd")
    p = cfg.parallelism
    if p is not None and p.model_parallel:
        raise AccelkitError(f"{flag}: DDP communication hooks apply to plain data parallelism, not to the "
                            f"{p.describe()} layout", hint="drop --tp-size/--cp-size/--sp-size, or drop "
                            "--grad-compression")
    if spec.method == "bf16" and cfg.runs_on_cpu:
        raise AccelkitError(f"{flag} on CPU ranks: {GLOO_BF16}",
                            hint="rehearse with --grad-compression fp16 (same bytes) on CPU; keep bf16 for GPU runs")


def _check_fsdp(spec: CompressionSpec, cfg: Any, flag: str) -> None:
    if spec.method in ("powersgd", "int8"):
        raise AccelkitError(f"{flag} is not an FSDP option: FSDP reduce-scatters gradient shards in its reduce dtype "
                            f"({'a DDP communication hook' if spec.method == 'powersgd' else 'no int8 reduction'})",
                            hint="under FSDP use --reduce-dtype bf16 (half the reduce-scatter bytes); PowerSGD "
                                 "needs --backend ddp, int8 needs --backend deepspeed --zero-stage 3")
    if cfg.fsdp is not None and cfg.fsdp.version != 2:
        raise AccelkitError(f"{flag}: the reduce dtype is FSDP2's MixedPrecisionPolicy, but the config is FSDP "
                            f"version {cfg.fsdp.version}", hint="use --fsdp-version 2")


def _check_deepspeed(spec: CompressionSpec, cfg: Any, flag: str) -> None:
    if spec.method != "int8":
        raise AccelkitError(f"{flag} is not a DeepSpeed option: DeepSpeed reduces gradients itself",
                            hint="set communication_data_type in your DeepSpeed JSON, or use --grad-compression int8 "
                                 "(ZeRO++) at --zero-stage 3")
    d = cfg.deepspeed
    stage = d.zero_stage if d is not None else None
    if stage is None and d is not None and d.json_content is not None:
        stage = d.json_content.get("zero_optimization", {}).get("stage")
    if stage is not None and stage != 3:
        raise AccelkitError(f"{flag} is ZeRO++, which quantizes ZeRO-3's weight all-gathers and gradient "
                            f"reduce-scatters; the config is ZeRO stage {stage}",
                            hint="add --zero-stage 3, or drop --grad-compression")
    if d is None or d.json_content is None:
        where = f"the DeepSpeed JSON {d.json_file}" if d is not None and d.json_file else "Accelerate's YAML"
        raise AccelkitError(f"{flag}: the ZeRO++ keys live in a DeepSpeed JSON that accelkit writes, and this config "
                            f"keeps its DeepSpeed settings in {where}",
                            hint="write the config to a file with -o FILE (the JSON is written beside it), or add "
                                 "--deepspeed-json ds.json, or set zero_quantized_weights/zero_quantized_gradients in "
                                 "your own JSON")
    if cfg.runs_on_cpu:
        raise AccelkitError(f"{flag} on CPU ranks: ZeRO++'s quantization kernels need CUDA",
                            hint="write the config with `accelkit config` and check it with `accelkit plan`; run "
                                 "it on GPUs")


def steps_of_script(args: Sequence[str]) -> int | None:
    """The run's optimizer steps when the script is given `--max-steps N` (accelkit's templates), else None."""
    for index, word in enumerate(args):
        match = re.fullmatch(r"--max[-_]steps(?:=(\d+))?", word)
        if match:
            value = match.group(1) or (args[index + 1] if index + 1 < len(args) else "")
            return int(value) if str(value).isdigit() else None
    return None


def start_step_warning(spec: CompressionSpec, steps: int | None) -> str | None:
    """PowerSGD compresses nothing before its start step: a run that ends first sends uncompressed gradients."""
    if spec.method != "powersgd" or steps is None or spec.powersgd_start_step < steps:
        return None
    return (f"--powersgd-start-step {spec.powersgd_start_step} is not before the run's {steps} steps: PowerSGD "
            "compresses nothing in this run (lower --powersgd-start-step)")
