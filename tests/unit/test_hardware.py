"""accelkit.hardware: GPUs are counted without importing torch where no GPU driver exists."""

from __future__ import annotations

import subprocess
import sys

import pytest

from accelkit import hardware


def test_no_driver_means_no_gpu_and_no_torch_import() -> None:
    code = ("import sys; from accelkit import hardware; import accelkit.hardware as h; "
            "h.gpu_driver_present = lambda: False; "
            "print(h.gpu_count(), h.local_gpus().count, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["0", "0", "False"]


def test_with_a_driver_torch_is_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(hardware, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    assert hardware.gpu_count() == 3


def test_driver_nodes_are_looked_for_where_drivers_put_them(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    monkeypatch.setattr(hardware.glob, "glob", lambda pattern: seen.append(pattern) or [])
    assert hardware.gpu_driver_present() is False
    assert "/dev/nvidiactl" in seen and "/dev/nvidia[0-9]*" in seen and "/dev/kfd" in seen
    only_gpu0 = lambda pattern: ["/dev/nvidia0"] if pattern == "/dev/nvidia[0-9]*" else []  # noqa: E731
    monkeypatch.setattr(hardware.glob, "glob", only_gpu0)
    assert hardware.gpu_driver_present() is True
