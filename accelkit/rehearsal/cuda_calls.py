"""The GPU-isms of hand-written DDP scripts, mapped to CPU in rehearsal ranks (never installed on GPUs).

PyTorch's own DDP tutorial, and many scripts written from it, pin each rank to its GPU by hand:

    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = Net().to(local_rank)                      # or .cuda(local_rank), .to(f"cuda:{local_rank}")
    model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)
    x = x.to(device)                                  # device = torch.device(f"cuda:{local_rank}")

On CPU each of these fails (torch refuses device ids for CPU modules; there is no CUDA and no NCCL). In a rehearsal
they mean "this rank's device", which is the CPU, so they are mapped: `set_device` and `synchronize` do nothing,
`current_device()` is the local rank, NCCL becomes gloo, `.to(<cuda device>)` / `.cuda()` on tensors and modules
stay on the CPU, and DistributedDataParallel of a CPU module gets no device ids. DDP's bf16 gradient-compression
hooks are accepted too: torch allows them only with CUDA 11+ and NCCL 2.10+ (what any current GPU setup has), and
gloo all-reduces bf16 tensors, so the hook runs as it would there. Rank 0 prints one line per kind
of mapping the first time it happens, naming the script's line. Tensors created directly on a CUDA device
(`torch.zeros(3, device="cuda")`) are not mapped: the rank stops with a one-line explanation (see explain.py).
"""

from __future__ import annotations

import functools
import inspect
import os
import sys

from accelkit.ranks import caller_location

_reported: set[str] = set()


def note_cuda_call(kind: str, text: str) -> None:
    """Say once per kind (on rank 0) what was mapped, and where in the script."""
    if kind in _reported:
        return
    _reported.add(kind)
    if os.environ.get("RANK", "0") == "0":
        print(f"accelkit: rehearsal on CPU: {text} at {caller_location(3)}", file=sys.stderr, flush=True)


def is_cuda_device(device) -> bool:
    """True for what names a CUDA device: torch.device('cuda', i), 'cuda', 'cuda:1', or a bare ordinal."""
    import torch

    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0].strip() == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _to_cpu_args(what: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if args and is_cuda_device(args[0]):
        note_cuda_call(what, f"{what}({args[0]!r}) keeps it on the CPU")
        args = ("cpu", *args[1:])
    if is_cuda_device(kwargs.get("device")):
        note_cuda_call(what, f"{what}(device={kwargs['device']!r}) keeps it on the CPU")
        kwargs = {**kwargs, "device": "cpu"}
    return args, kwargs


def _wrap_to(original, what: str):
    @functools.wraps(original)
    def to(self, *args, **kwargs):
        args, kwargs = _to_cpu_args(what, args, kwargs)
        return original(self, *args, **kwargs)

    return to


def _patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        module = bound.arguments.get("module")
        ids, output = bound.arguments.get("device_ids"), bound.arguments.get("output_device")
        on_cpu = module is not None and all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu and (ids is not None or output is not None):
            note_cuda_call("ddp", f"DistributedDataParallel(device_ids={ids!r}, output_device={output!r}) of a CPU "
                                  "module runs without device ids")
            bound.arguments["device_ids"] = None
            bound.arguments["output_device"] = None
        original(*bound.args, **bound.kwargs)

    DistributedDataParallel.__init__ = init


_BF16_HOOKS = ("bf16_compress_hook", "bf16_compress_wrapper_hook")


def _patch_bf16_comm_hooks() -> None:
    from torch.nn.parallel import DistributedDataParallel

    original = DistributedDataParallel._check_comm_hook

    @functools.wraps(original)
    def check_comm_hook(self, hook):
        if getattr(hook, "__name__", "") not in _BF16_HOOKS:
            return original(self, hook)
        note_cuda_call("bf16 hook", f"DDP's {hook.__name__} (CUDA 11+ and NCCL 2.10+ on GPUs) runs on gloo")

        @functools.wraps(hook)
        def same_hook(*args, **kwargs):
            return hook(*args, **kwargs)

        same_hook.__name__ = f"accelkit_rehearsal_{hook.__name__}"  # every other check of torch's still applies
        return original(self, same_hook)

    DistributedDataParallel._check_comm_hook = check_comm_hook


def _patch_process_group() -> None:
    import torch.distributed as dist

    original = dist.init_process_group
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        backend = bound.arguments.get("backend")
        if backend is not None and "nccl" in str(backend).lower():
            note_cuda_call("nccl", f"init_process_group(backend={backend!r}) uses gloo")
            bound.arguments["backend"] = "gloo"
        if is_cuda_device(bound.arguments.get("device_id")):
            bound.arguments["device_id"] = None
        return original(*bound.args, **bound.kwargs)

    dist.init_process_group = init_process_group


def install() -> None:
    """Patch torch (imported by now) for a CPU rehearsal rank."""
    import torch

    if torch.cuda.is_available():  # never on GPUs (rehearsal hides them; the shim refuses to run beside CUDA)
        return

    def set_device(device) -> None:
        note_cuda_call("set_device", f"torch.cuda.set_device({device!r}) does nothing")

    def synchronize(device=None) -> None:
        return None

    def current_device() -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    torch.cuda.set_device = set_device
    torch.cuda.synchronize = synchronize
    torch.cuda.current_device = current_device
    torch.Tensor.to = _wrap_to(torch.Tensor.to, "tensor.to")
    torch.nn.Module.to = _wrap_to(torch.nn.Module.to, "module.to")

    def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        note_cuda_call("tensor.cuda", "tensor.cuda() keeps it on the CPU")
        return self.cpu(memory_format=memory_format)

    def module_cuda(self, device=None):
        note_cuda_call("module.cuda", "module.cuda() keeps it on the CPU")
        return self.cpu()

    torch.Tensor.cuda = tensor_cuda
    torch.nn.Module.cuda = module_cuda
    _patch_ddp()
    _patch_bf16_comm_hooks()
    _patch_process_group()
