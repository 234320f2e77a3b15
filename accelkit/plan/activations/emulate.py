"""What a GPU (or CPU) run would do, replayed on meta tensors: autocast's casts and the attention kernel's saves.

Meta tensors have shapes and dtypes but no device behaviour: autocast does not apply to them, and
`scaled_dot_product_attention` on meta always takes the math path (which saves the s x s attention matrix). To trace
what a real run keeps for its backward, this torch-function mode applies, per device:

- autocast's op lists (PyTorch's "Autocast Op Reference"): ops in the lower-precision list run in the autocast
  dtype, with the casts of parameters cached for the forward, as autocast does; ops in the float32 list run in
  float32. CUDA and CPU have different lists (e.g. CUDA runs softmax and layer_norm in float32, CPU does not).
- the attention kernel PyTorch's SDPA dispatcher picks: on CUDA, flash attention for fp16/bf16 without a mask,
  memory-efficient attention otherwise, the math path as a last resort; on CPU, the fused flash kernel unless
  dropout is active in training (then the math path, in float32 for 16-bit inputs). Fused kernels save q, k, v, the
  output and the log-sum-exp (plus the mask), never the attention matrix.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

T = torch.Tensor
_MATMULS = {F.linear, torch.matmul, T.matmul, T.__matmul__, T.__rmatmul__, torch.mm, T.mm, torch.bmm, T.bmm,
            torch.baddbmm, T.baddbmm, torch.addmm, T.addmm, torch.addbmm, T.addbmm, F.conv1d, F.conv2d, F.conv3d,
            F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d, F.prelu,
            *[f for f in (getattr(torch, "_grouped_mm", None),) if f is not None]}  # mixture-of-experts matmuls
_CUDA_ONLY_LOWER = {torch.addmv, T.addmv, torch.addr, T.addr, torch.mv, T.mv, torch.chain_matmul}
_LOSSES = {F.cross_entropy, F.nll_loss, F.mse_loss, F.binary_cross_entropy, F.binary_cross_entropy_with_logits,
           F.kl_div, F.smooth_l1_loss, F.huber_loss, F.margin_ranking_loss, F.soft_margin_loss,
           F.multilabel_margin_loss, F.hinge_embedding_loss, F.poisson_nll_loss, F.cosine_embedding_loss,
           F.triplet_margin_loss, F.multi_margin_loss, F.l1_loss}
_CUDA_FP32 = _LOSSES | {
    F.softmax, T.softmax, torch.softmax, F.log_softmax, T.log_softmax, torch.log_softmax, F.softmin, F.layer_norm,
    F.group_norm, F.normalize, F.softplus, torch.exp, T.exp, torch.expm1, T.expm1, torch.log, T.log, torch.log1p,
    T.log1p, torch.log2, T.log2, torch.log10, T.log10, torch.pow, T.pow, T.__pow__, T.__rpow__, torch.rsqrt,
    T.rsqrt, torch.reciprocal, T.reciprocal, torch.sum, T.sum, torch.prod, T.prod, torch.cumsum, T.cumsum,
    torch.cumprod, T.cumprod, torch.norm, T.norm, torch.cdist, torch.acos, T.acos, torch.asin, T.asin, torch.cosh,
    T.cosh, torch.sinh, T.sinh, torch.tan, T.tan, torch.erfinv, T.erfinv, F.cosine_similarity, T.__rtruediv__}
_CPU_FP32 = _LOSSES | {torch.prod, T.prod, torch.cdist}

LOWER = {"cuda": _MATMULS | _CUDA_ONLY_LOWER, "cpu": _MATMULS}
FLOAT32 = {"cuda": _CUDA_FP32, "cpu": _CPU_FP32}
FLASH_MAX_HEAD_DIM = 256  # flash attention's limit on CUDA (sm80+); larger heads use memory-efficient attention
EFFICIENT_LSE_BLOCK = 32  # memory-efficient attention pads its log-sum-exp to a multiple of 32 queries


class _KernelSaves(torch.autograd.Function):
    """A fused attention kernel as autograd sees it: the output, and q, k, v, (mask,) out, log-sum-exp saved."""

    @staticmethod
    def forward(ctx, query, key, value, mask, lse_length):
        if query.dim() == 4:  # fused kernels write (batch, seq, heads, dim) and return it as a transposed view
            batch, heads, length, _ = query.shape
            out = query.new_empty((batch, length, heads, value.shape[-1])).transpose(1, 2)
        else:
            out = query.new_empty((*query.shape[:-1], value.shape[-1]))
        lse = query.new_empty((*query.shape[:-2], lse_length), dtype=torch.float32)
        saved = (query, key, value, out, lse) if mask is None else (query, key, value, mask, out, lse)
        ctx.save_for_backward(*saved)
        return out

    @staticmethod
    def backward(ctx, grad):  # never run: traces stop after the forward
        raise NotImplementedError


def attention_kernel(device: str, query, attn_mask, dropout_p: float, training: bool) -> str:
    """'flash', 'efficient' or 'math': the kernel PyTorch's SDPA would run for these inputs."""
    if device == "cpu":
        return "flash" if not (training and dropout_p > 0) else "math"
    head_dim = query.shape[-1]
    if query.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and head_dim <= FLASH_MAX_HEAD_DIM:
        return "flash"
    return "efficient"


class DeviceEmulation(TorchFunctionMode):
    """Replay autocast (when `autocast_dtype` is set) and the SDPA kernel choice of `device` ("cuda" or "cpu")."""

    def __init__(self, device: str, autocast_dtype: torch.dtype | None, training: bool = True) -> None:
        super().__init__()
        self.device = device
        self.autocast_dtype = autocast_dtype
        self.training = training
        self.kernels: dict[str, int] = {}
        self._cast_cache: dict[int, torch.Tensor] = {}

    def _cast(self, value, dtype):
        if not isinstance(value, torch.Tensor) or not value.is_floating_point() or value.dtype == dtype:
            return value
        if value.is_leaf and value.requires_grad:  # autocast caches the casts of parameters for the forward
            cached = self._cast_cache.get(id(value))
            if cached is None:
                cached = self._cast_cache[id(value)] = value.to(dtype)
            return cached
        return value.to(dtype)

    def _cast_all(self, args, kwargs, dtype):
        return tuple(self._cast(a, dtype) for a in args), {k: self._cast(v, dtype) for k, v in kwargs.items()}

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is F.scaled_dot_product_attention:
            if self.autocast_dtype is not None:
                args, kwargs = self._cast_all(args, kwargs, self.autocast_dtype)
            return self._attention(*args, **kwargs)
        if self.autocast_dtype is not None:
            if func in LOWER[self.device]:
                args, kwargs = self._cast_all(args, kwargs, self.autocast_dtype)
            elif func in FLOAT32[self.device]:
                args, kwargs = self._cast_all(args, kwargs, torch.float32)
        return func(*args, **kwargs)

    def _attention(self, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
        kernel = attention_kernel(self.device, query, attn_mask, dropout_p, self.training)
        self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        if kernel == "math":
            if key.shape[-3] != query.shape[-3]:  # the math path repeats grouped key/value heads
                repeat = query.shape[-3] // key.shape[-3]
                key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
            original = query.dtype
            if self.device == "cpu" and original in (torch.float16, torch.bfloat16):  # CPU's math path upcasts
                query, key, value = query.float(), key.float(), value.float()
            out = F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                                 is_causal=is_causal, scale=scale)
            return out.to(original)
        if kernel == "efficient" and key.shape[-3] != query.shape[-3]:
            repeat = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(repeat, -3), value.repeat_interleave(repeat, -3)
        if attn_mask is not None and attn_mask.dtype == torch.bool:  # SDPA turns a boolean mask into an additive one
            attn_mask = attn_mask.new_empty(attn_mask.shape, dtype=query.dtype)
        length = query.shape[-2]
        if kernel == "efficient":
            length = math.ceil(length / EFFICIENT_LSE_BLOCK) * EFFICIENT_LSE_BLOCK
        return _KernelSaves.apply(query, key, value, attn_mask, length)
