"""The meta-device emulation does what the device does: CPU autocast's dtypes op by op against real CPU autocast,
the attention kernels' saved tensors against real SDPA on CPU, and the CUDA kernel choice of PyTorch's dispatcher."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from accelkit.plan.activations.count import ActivationCounter
from accelkit.plan.activations.emulate import DeviceEmulation, attention_kernel

OPS = {
    "linear": lambda x, w: F.linear(x, w), "matmul": lambda x, w: x @ w,
    "bmm": lambda x, w: torch.bmm(x[None], w[None]),
    "softmax": lambda x, w: F.softmax(x, -1), "layer_norm": lambda x, w: F.layer_norm(x, (8,)),
    "cross_entropy": lambda x, w: F.cross_entropy(x, torch.zeros(4, dtype=torch.long, device=x.device)),
    "mse": lambda x, w: F.mse_loss(x, x), "gelu": lambda x, w: F.gelu(x), "pow": lambda x, w: x.pow(2),
    "sum": lambda x, w: x.sum(), "conv2d": lambda x, w: F.conv2d(x[None, None], w[None, None, :2, :2]),
    "add": lambda x, w: x + w[0],
}


@pytest.mark.parametrize("op", list(OPS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_autocast_dtypes_match_real_cpu_autocast(op: str, dtype: torch.dtype) -> None:
    real_x, real_w = torch.randn(4, 8, dtype=dtype), torch.randn(8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = OPS[op](real_x, real_w).dtype
    meta_x, meta_w = torch.empty(4, 8, dtype=dtype, device="meta"), torch.empty(8, 8, device="meta")
    with DeviceEmulation("cpu", torch.bfloat16):
        assert OPS[op](meta_x, meta_w).dtype == expected


def _saved(q, k, v, emulate: bool, **kwargs) -> list[tuple[tuple[int, ...], torch.dtype]]:
    saved = []

    def pack(t):
        saved.append((tuple(t.shape), t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if emulate:
            with DeviceEmulation("cpu", None):
                F.scaled_dot_product_attention(q, k, v, **kwargs)
        else:
            F.scaled_dot_product_attention(q, k, v, **kwargs)
    return sorted(saved, key=str)


@pytest.mark.parametrize("kwargs", [{"is_causal": True}, {"enable_gqa": True},
                                    {"attn_mask": torch.ones(2, 1, 16, 16, dtype=torch.bool)}, {"dropout_p": 0.1}])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_attention_saves_what_real_sdpa_saves(kwargs: dict, dtype: torch.dtype) -> None:
    kv_heads = 2 if kwargs.get("enable_gqa") else 4
    real = [torch.randn(2, h, 16, 8, dtype=dtype, requires_grad=True) for h in (4, kv_heads, kv_heads)]
    meta = [torch.empty(2, h, 16, 8, dtype=dtype, device="meta", requires_grad=True) for h in (4, kv_heads, kv_heads)]
    meta_kwargs = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()}
    assert _saved(*meta, True, **meta_kwargs) == _saved(*real, False, **kwargs)


def test_cuda_kernel_choice() -> None:
    bf16 = torch.empty(1, 4, 16, 64, dtype=torch.bfloat16, device="meta")
    fp32 = torch.empty(1, 4, 16, 64, device="meta")
    mask = torch.empty(1, 1, 16, 16, device="meta")
    assert attention_kernel("cuda", bf16, None, 0.1, True) == "flash"  # flash attention also does dropout
    assert attention_kernel("cuda", bf16, mask, 0.0, True) == "efficient"  # flash takes no mask
    assert attention_kernel("cuda", fp32, None, 0.0, True) == "efficient"  # flash needs 16-bit inputs
    big_heads = torch.empty(1, 4, 16, 512, dtype=torch.bfloat16, device="meta")
    assert attention_kernel("cuda", big_heads, None, 0.0, True) == "efficient"


def test_cuda_autocast_keeps_softmax_in_fp32_and_caches_weight_casts() -> None:
    linear = torch.nn.Linear(8, 8, device="meta")
    x = torch.empty(4, 8, device="meta", requires_grad=True) * 1  # hidden states: the weight is saved for them
    with DeviceEmulation("cuda", torch.bfloat16), ActivationCounter(linear) as counter:
        hidden = linear(x)
        again = linear(x)
        probs = F.softmax(hidden, -1)
    assert hidden.dtype == torch.bfloat16 and probs.dtype == torch.float32
    # the weight is cast once (autocast's cache) and that copy, saved for the backward, is not an activation
    assert counter.result().weight_copies == 8 * 8 * 2 and again.dtype == torch.bfloat16
