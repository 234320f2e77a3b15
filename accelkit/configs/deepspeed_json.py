"""The DeepSpeed JSON written by --deepspeed-json: explicit where the user chose, "auto" where Accelerate fills in.

Accelerate replaces "auto" from the script at prepare() time: batch sizes from the prepared DataLoader, gradient
accumulation from Accelerator(...), clipping, and fp16/bf16 from the mixed precision. Keys whose "auto" needs
`model.config.hidden_size` (bucket sizes) are left out, so plain nn.Module models work too.
"""

from __future__ import annotations

from accelkit.configs.options import ConfigOptions


def _offload(device: str, nvme_path: str | None) -> dict:
    block: dict = {"device": device, "pin_memory": True}
    if device == "nvme":
        block["nvme_path"] = nvme_path
    return block


def deepspeed_json_content(r: ConfigOptions) -> dict:
    """The JSON for resolved options `r` (backend deepspeed)."""
    stage = r.zero_stage if r.zero_stage is not None else 2
    zero: dict = {"stage": stage}
    if stage >= 1:
        zero.update({"overlap_comm": True, "contiguous_gradients": True})
    if r.offload_optimizer and r.offload_optimizer != "none":
        zero["offload_optimizer"] = _offload(r.offload_optimizer, r.nvme_path)
    if r.offload_params and r.offload_params != "none":
        zero["offload_param"] = _offload(r.offload_params, r.nvme_path)
    if stage == 3:
        zero["stage3_gather_16bit_weights_on_model_save"] = bool(r.zero3_save_16bit_model)
    if stage == 3 and r.grad_compression == "int8":  # ZeRO++ (accelkit.compression.zeropp)
        from accelkit.compression.zeropp import zeropp_keys

        zero.update(zeropp_keys(r.num_processes or 1, r.num_machines or 1))
    if r.mixed_precision is None:  # not chosen: Accelerate fills both from Accelerator(mixed_precision=...)
        fp16: object = "auto"
        bf16: object = "auto"
    else:
        fp16 = r.mixed_precision == "fp16"
        bf16 = r.mixed_precision == "bf16"
    content: dict = {
        "fp16": {"enabled": fp16},
        "bf16": {"enabled": bf16},
        "zero_optimization": zero,
        "gradient_accumulation_steps": r.gradient_accumulation_steps or "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "wall_clock_breakdown": False,
    }
    return content
