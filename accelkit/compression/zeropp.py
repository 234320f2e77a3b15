"""int8 for DeepSpeed: ZeRO++ (Wang et al. 2023), the keys of ZeRO-3's `zero_optimization` block.

    zero_quantized_weights    qwZ: the forward/backward weight all-gathers in int8 (blockwise quantization)
    zero_quantized_gradients  qgZ: gradient reduce-scatter in int4/int8 via all-to-all, dequantized before reduction
    zero_hpz_partition_size   hpZ: a second copy of the weights sharded within a machine, so backward's all-gather
                              stays on the intra-node links; the processes per machine when the job spans machines
                              (1 = off: on one machine there is no slower link to avoid)

DeepSpeed's own config class (deepspeed.runtime.config.DeepSpeedConfig) must accept the JSON accelkit writes.
"""

from __future__ import annotations

import contextlib
import copy
import io
from typing import Any

from accelkit.errors import AccelkitError


def zeropp_keys(num_processes: int, num_machines: int) -> dict[str, Any]:
    per_machine = num_processes // max(num_machines, 1)
    hpz = per_machine if num_machines > 1 and per_machine > 1 else 1
    return {"zero_quantized_weights": True, "zero_quantized_gradients": True, "zero_hpz_partition_size": hpz}


def check_with_deepspeed(content: dict[str, Any]) -> None:
    """DeepSpeedConfig must accept `content` ("auto" values dropped, batch sizes of one process: outside a process
    group DeepSpeed counts one), with the ZeRO++ keys read back as given. AccelkitError otherwise."""
    # DeepSpeed logs its accelerator detection on import ("[WARNING] ... Setting accelerator to CPU"): noise for
    # someone writing a config. Its logger's handler takes the stream current at import, so it stays quiet after.
    quiet = io.StringIO()
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        return  # config writes without DeepSpeed installed; launch refuses DeepSpeed runs without it
    filled = _without_auto(copy.deepcopy(content))
    filled.update(train_micro_batch_size_per_gpu=1, gradient_accumulation_steps=1, train_batch_size=1)
    try:
        with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet):
            parsed = DeepSpeedConfig(filled)
    except Exception as exc:  # noqa: BLE001 - DeepSpeed raises assorted types for a bad config
        raise AccelkitError(f"DeepSpeed rejects the ZeRO++ config: {'; '.join(str(exc).split(chr(10))[:3])}",
                            hint="check the zero_optimization block of the DeepSpeed JSON") from None
    zero = parsed.zero_config
    expected = content["zero_optimization"]
    for key in ("zero_quantized_weights", "zero_quantized_gradients", "zero_hpz_partition_size"):
        if getattr(zero, key) != expected[key]:
            raise AccelkitError(f"DeepSpeed read {key} as {getattr(zero, key)!r}, not {expected[key]!r}",
                                hint="upgrade DeepSpeed to a version with ZeRO++ (0.10 or later)")


def _without_auto(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_auto(item) for key, item in value.items() if item != "auto"}
    return value
