"""A single-GPU script's CUDA calls, rehearsed on the CPU: the process believes it has one GPU, which is the CPU.

`accelkit convert --check` runs the original script on one process beside its conversion, both on the CPU (GPUs
hidden). An original written for one GPU (`model.cuda()`, `.to(0)`, `init_process_group("nccl")`, `DataParallel`,
`assert torch.cuda.is_available()`) stops at its first CUDA call, and nothing can be compared. When it does, the
check runs it again with this module installed (ACCELKIT_REHEARSAL=one-gpu, in the original's process only; the
conversion always runs on the CPU for real). On top of the rank rehearsal's mappings (cuda_calls.py: `.to(cuda)`,
`.cuda()`, set_device, synchronize, device ids, nccl -> gloo), it patches torch's public entry points so that:

- `torch.cuda.is_available()` is True and `device_count()` is 1 (the GPU the original was written for), so the
  script takes its GPU branch; `is_bf16_supported()` is True (the CPU computes bf16);
- tensors made on a CUDA device (`torch.zeros(n, device="cuda")`, `torch.tensor(x, device=0)`) are made on the
  CPU, `pin_memory()` returns the tensor itself (host memory already), and `torch.load(map_location=cuda)` loads
  onto the CPU;
- `DataParallel` of a CPU module calls the module itself, which is what it does on one GPU;
- memory queries answer 0 and `empty_cache()` / `reset_peak_memory_stats()` do nothing.

cudnn / TF32 flags and `GradScaler` need nothing: the flags are plain settings, and once CUDA is "available" the
GradScaler scales and unscales with torch's CPU kernels (powers of two: the gradients are the same). Regions under
`autocast("cuda")` compute in float32, as CPU tensors under a CUDA autocast do. What has no CPU meaning stays
unmapped and fails with its own error: CUDA streams and events, CUDA-only kernels (jiterator, Triton, extensions),
device properties.
"""

from __future__ import annotations

import functools

# torch's factories that take `device=` (looked up on `torch` at call time, so a script's `torch.zeros` sees the patch)
FACTORIES = ("tensor", "as_tensor", "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm",
             "arange", "linspace", "logspace", "eye", "zeros_like", "ones_like", "empty_like", "full_like",
             "rand_like", "randn_like", "randint_like")
MEMORY_QUERIES = ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")
NO_OPS = ("empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated", "ipc_collect")


def _made_on_cpu(factory):
    from accelkit.rehearsal.cuda_calls import is_cuda_device, note_cuda_call

    @functools.wraps(factory)
    def make(*args, **kwargs):
        if is_cuda_device(kwargs.get("device")):
            note_cuda_call("factory", f"torch.{factory.__name__}(device={kwargs['device']!r}) makes it on the CPU")
            kwargs["device"] = "cpu"
        return factory(*args, **kwargs)

    return make


def _patch_data_parallel() -> None:
    """DataParallel of a CPU module: torch's own no-device path (the module is called as it is), as on one GPU."""
    import torch
    from torch.nn.parallel import DataParallel

    from accelkit.rehearsal.cuda_calls import note_cuda_call

    original = DataParallel.__init__

    @functools.wraps(original)
    def init(self, module, device_ids=None, output_device=None, dim=0):
        if any(p.device.type != "cpu" for p in module.parameters()):
            return original(self, module, device_ids, output_device, dim)
        note_cuda_call("data parallel", "DataParallel on one GPU calls the module itself")
        torch.nn.Module.__init__(self)
        self.module, self.device_ids, self.dim = module, [], dim
        return None

    DataParallel.__init__ = init


def _patch_load() -> None:
    import torch

    from accelkit.rehearsal.cuda_calls import is_cuda_device, note_cuda_call

    original = torch.load

    @functools.wraps(original)
    def load(f, map_location=None, *args, **kwargs):
        if map_location is None or is_cuda_device(map_location):  # a checkpoint saved on a GPU, or loaded onto one
            if map_location is not None:
                note_cuda_call("load", f"torch.load(map_location={map_location!r}) loads onto the CPU")
            map_location = "cpu"
        return original(f, map_location, *args, **kwargs)

    torch.load = load


def install() -> None:
    """Patch torch (imported by now) for an original that runs its CUDA code on this CPU-only process."""
    import torch

    from accelkit.rehearsal import cuda_calls

    if torch.cuda.is_available():  # a real GPU: nothing to rehearse
        return
    cuda_calls.install()
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: 1
    torch.cuda.is_bf16_supported = lambda including_emulation=True: True
    torch.cuda.get_device_name = lambda device=None: "CPU (CUDA rehearsed)"
    for name in MEMORY_QUERIES:
        setattr(torch.cuda, name, lambda device=None: 0)
    for name in NO_OPS:
        setattr(torch.cuda, name, lambda device=None: None)
    for name in FACTORIES:
        setattr(torch, name, _made_on_cpu(getattr(torch, name)))
    torch.Tensor.pin_memory = lambda self, device=None: self
    _patch_data_parallel()
    _patch_load()
