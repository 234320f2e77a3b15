"""Fake GPUs for the GPU-shaped SLURM job test (tests/integration/test_slurm.py): on PYTHONPATH, this makes
`torch.cuda.device_count()` the number of devices SLURM gave the process in CUDA_VISIBLE_DEVICES (the test cluster's
`Gres=gpu:8` of placeholder device files), and `torch.cuda.is_available()` true when there is one; accelkit.hardware
sees a GPU driver (its placeholder device files are not under /dev).

That is all a node's launcher asks of the hardware (accelkit's GPU check, Accelerate's multi-GPU launcher), so
accelkit's own sbatch script and per-node launcher run unchanged up to the ranks; the ranks run a recording stub
that never touches CUDA. Lazy: torch is patched when it loads, and processes that never import it pay nothing.
"""

import importlib.abc
import importlib.machinery
import os
import sys


def _visible_devices() -> int:
    return len([device for device in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if device.strip()])


def _patch_torch_cuda(module) -> None:
    module.device_count = _visible_devices
    module.is_available = lambda: _visible_devices() > 0


def _patch_accelkit_hardware(module) -> None:
    module.gpu_driver_present = lambda: _visible_devices() > 0


_PATCHES = {"torch.cuda": _patch_torch_cuda, "accelkit.hardware": _patch_accelkit_hardware}


class _FakeCudaFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = _PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module):
            real_exec(module)
            patch(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _FakeCudaFinder())
