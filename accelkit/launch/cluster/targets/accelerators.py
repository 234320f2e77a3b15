"""Accelerator names SkyPilot's catalog uses (`resources.accelerators: NAME:COUNT`), checked before a task is written.

SkyPilot itself accepts any name offline (it might be a custom Kubernetes label) and fails only when no cloud
offers it, after `sky launch` has started looking; accelkit refuses a misspelled name at once. The list holds
SkyPilot's common GPUs (sky.catalog.get_common_gpus(), checked by the tests) and the other names its clouds'
catalogs use; TPUs are `tpu-<version>-<cores>` (e.g. tpu-v5p-8). A name not listed here but offered by your
clouds can still be written into the task by hand.
"""

from __future__ import annotations

from accelkit.errors import AccelkitError

KNOWN_ACCELERATORS = (
    # NVIDIA data center
    "B200", "B300", "GB200", "H100", "H100-MEGA", "H200", "GH200", "A100", "A100-80GB", "A40", "A30", "A10", "A10G",
    "L40S", "L40", "L4", "V100", "V100-32GB", "T4", "T4g", "P100", "P40", "P4", "K80", "M60",
    # NVIDIA workstation
    "RTXPRO6000", "RTX6000", "RTX6000-Ada", "A6000", "A5000", "A4000", "RTX5090", "RTX4090", "RTX3090", "RTX3080",
    # AMD and others
    "MI300X", "MI325X", "MI250", "MI210", "MI100", "Gaudi", "Gaudi2", "Gaudi3", "Inferentia", "Inferentia2",
    "Trainium", "Trainium2",
)
FIND_NAMES = "`sky gpus list` shows what your clouds offer"


def canonical_accelerator(name: str) -> str:
    """SkyPilot's spelling of `name` (case-insensitive), or a one-line refusal."""
    if name.lower().startswith("tpu-") and len(name) > 4:
        return name.lower()  # SkyPilot's TPU names are lowercase: tpu-v4-8, tpu-v6e-1
    for known in KNOWN_ACCELERATORS:
        if known.lower() == name.lower():
            return known
    raise AccelkitError(f"unknown accelerator {name!r} for --accelerator",
                        hint=f"use a SkyPilot name such as H100, A100-80GB, L4 or tpu-v5p-8 ({FIND_NAMES})")
