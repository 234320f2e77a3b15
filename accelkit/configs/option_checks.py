"""Option combinations that cannot work, rejected before anything is written, naming the flag to change."""

from __future__ import annotations

from accelkit.configs.options import DEEPSPEED_ONLY, FSDP_ONLY, ConfigOptions, flag_name
from accelkit.errors import AccelkitError


def check_options(r: ConfigOptions) -> None:
    """Reject combinations that cannot work, naming the flag to change. `r` is resolved (defaults filled)."""
    def fail(message: str, hint: str) -> None:
        raise AccelkitError(message, hint=hint)

    if r.num_processes < 1:
        fail(f"--num-processes must be at least 1 (got {r.num_processes})", "pass --num-processes N with N >= 1")
    if r.num_machines < 1:
        fail(f"--num-machines must be at least 1 (got {r.num_machines})", "pass --num-machines 1 for one machine")
    if not 0 <= r.machine_rank < r.num_machines:
        fail(f"--machine-rank {r.machine_rank} is outside 0..{r.num_machines - 1} for {r.num_machines} machine(s)",
             "machine ranks count from 0: the main machine is 0, the last is --num-machines minus 1")
    if r.backend == "single" and r.num_machines > 1:
        fail(f"--backend single runs one process on one machine, not {r.num_machines} machines",
             "use --backend ddp (or fsdp/deepspeed) for several machines")
    if r.num_processes % r.num_machines:
        fail(f"--num-processes {r.num_processes} is not divisible by --num-machines {r.num_machines}",
             "--num-processes is the TOTAL across machines: use machines x processes per machine, e.g. "
             f"{r.num_machines * -(-r.num_processes // r.num_machines)}")
    if r.main_process_port is not None and not 1 <= r.main_process_port <= 65535:
        fail(f"--main-process-port {r.main_process_port} is not a TCP port",
             "use a free port in 1024..65535, e.g. 29500")
    if r.gradient_accumulation_steps is not None and r.gradient_accumulation_steps < 1:
        fail("--gradient-accumulation-steps must be at least 1", "pass --gradient-accumulation-steps 1 for none")
    if r.backend == "single" and r.num_processes != 1:
        fail(f"--backend single runs one process, not {r.num_processes}",
             "use --backend ddp (or fsdp/deepspeed) for several processes")
    if r.mixed_precision == "fp16" and r.backend == "cpu":
        fail("fp16 mixed precision does not run on CPU", "use --mixed-precision bf16 (or no) with --backend cpu")
    _check_backend_options(r, fail)
    if r.backend == "fsdp":
        _check_fsdp(r, fail)
    if r.backend == "deepspeed":
        _check_deepspeed(r, fail)


def _check_backend_options(r: ConfigOptions, fail) -> None:
    given = {k for k, v in r.given().items() if v is not False}
    if r.backend != "fsdp":
        misplaced = [n for n in FSDP_ONLY if n in given]
        if misplaced:
            fail(f"{flag_name(misplaced[0])} is an FSDP option, but the backend is {r.backend}",
                 f"add --backend fsdp, or drop {flag_name(misplaced[0])}")
    if r.backend != "deepspeed":
        misplaced = [n for n in DEEPSPEED_ONLY if n in given]
        if misplaced:
            fail(f"{flag_name(misplaced[0])} is a DeepSpeed option, but the backend is {r.backend}",
                 f"add --backend deepspeed, or drop {flag_name(misplaced[0])}")
        if r.gradient_accumulation_steps is not None:
            fail(f"Accelerate config files store gradient accumulation only for DeepSpeed, not {r.backend}",
                 "pass gradient_accumulation_steps=N to Accelerator(...) in your script, or give "
                 "--gradient-accumulation-steps to `accelkit launch` "
                 "(it exports ACCELERATE_GRADIENT_ACCUMULATION_STEPS)")
    if r.backend not in ("fsdp", "deepspeed") and r.offload:
        fail(f"--offload needs --backend fsdp or deepspeed (the backend is {r.backend})",
             "use --backend fsdp --offload or --backend deepspeed --zero-stage 3 --offload")


def _check_fsdp(r: ConfigOptions, fail) -> None:
    if r.wrap_cls and r.wrap_policy != "transformer":
        fail(f"--wrap-cls only applies to --wrap-policy transformer (the policy is {r.wrap_policy})",
             "drop --wrap-cls, or use --wrap-policy transformer")
    if r.min_num_params is not None and r.wrap_policy != "size":
        fail(f"--min-num-params only applies to --wrap-policy size (the policy is {r.wrap_policy})",
             "drop --min-num-params, or use --wrap-policy size")
    if r.min_num_params is not None and r.min_num_params < 1:
        fail("--min-num-params must be at least 1", "pass a parameter count such as 100000000")
    if r.fsdp_version == 2 and r.sharding == "no":
        fail("FSDP2 has no NO_SHARD strategy", "use --backend ddp (same thing, faster), or --fsdp-version 1")
    if r.fsdp_version == 2 and r.sharding == "hybrid" and r.num_machines < 2:
        fail("--sharding hybrid with FSDP2 replicates across machines, but there is only one machine",
             "use --sharding full on one machine, or set --num-machines; --fsdp-version 1 keeps HYBRID_SHARD")


def _check_deepspeed(r: ConfigOptions, fail) -> None:
    if r.offload_params != "none" and r.zero_stage < 3:
        fail(f"DeepSpeed offloads parameters only at ZeRO stage 3 (the stage is {r.zero_stage})",
             "use --zero-stage 3, or --offload-params none")
    if r.offload_optimizer != "none" and r.zero_stage == 0:
        fail("ZeRO stage 0 cannot offload the optimizer", "use --zero-stage 1 or higher, or --offload-optimizer none")
    if r.zero3_save_16bit_model and r.zero_stage < 3:
        fail(f"--zero3-save-16bit-model applies to ZeRO stage 3 only (the stage is {r.zero_stage})",
             "use --zero-stage 3, or drop --zero3-save-16bit-model")
    uses_nvme = "nvme" in (r.offload_optimizer, r.offload_params)
    if uses_nvme and not r.nvme_path:
        fail("NVMe offload needs a directory to swap to", "pass --nvme-path /local/nvme/dir")
    if r.nvme_path and not uses_nvme:
        fail("--nvme-path is set but nothing is offloaded to nvme",
             "add --offload-optimizer nvme and/or --offload-params nvme, or drop --nvme-path")
