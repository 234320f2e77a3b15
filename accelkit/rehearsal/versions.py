"""Which Accelerate / DeepSpeed versions the rehearsal shim is known to work with, and the check that enforces it.

The shim reaches into Accelerate's state set-up (see shim.py), so it is only trusted on the versions it was tested
on. An untested version is refused with a clear message instead of silently producing a run that is not what the
user asked for; ACCELKIT_REHEARSAL_ALLOW_UNTESTED=1 lets a user try anyway.
"""

from __future__ import annotations

import os
from importlib import metadata

from packaging.version import InvalidVersion, Version

from accelkit.errors import AccelkitError

# Tested with torch 2.13 CPU: accelerate 1.13.0, 1.14.0 and 1.15.0 (FSDP2 and DeepSpeed ZeRO-3 probes: sharding,
# save_state, load_state). 1.10.1 and 1.12.0 run DeepSpeed, but their FSDP2 load_state fails ("Missing key in
# checkpoint state_dict: optimizer.state.0.step"; Accelerate saved the optimizer with optimizer.state_dict() before
# 1.13, not a CPU issue), so rehearsal starts at 1.13. The two hooks used (PartialState._prepare_backend and
# AcceleratorState.__init__) have the same shape across that range.
ACCELERATE_RANGE = ("1.13.0", "1.16.0")
# Tested: deepspeed 0.19.8 with DS_ACCELERATOR=cpu (ZeRO-1/2/3 over gloo).
DEEPSPEED_RANGE = ("0.19.0", "0.20.0")

ALLOW_UNTESTED_ENV = "ACCELKIT_REHEARSAL_ALLOW_UNTESTED"
DEEPSPEED_INSTALL_HINT = "pip install 'accelkit[deepspeed]'"


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist`, or None when it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _in_range(version: str, bounds: tuple[str, str]) -> bool:
    try:
        # Compare the release only, so 1.15.0.dev0 or 0.19.8+cpu count as their release.
        release = Version(Version(version).base_version)
    except InvalidVersion:
        return False
    return Version(bounds[0]) <= release < Version(bounds[1])


def _check(dist: str, bounds: tuple[str, str], hint_install: str) -> None:
    version = installed_version(dist)
    if version is None:
        raise AccelkitError(f"CPU rehearsal needs {dist}, which is not installed.", hint=hint_install)
    if _in_range(version, bounds) or os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return
    raise AccelkitError(
        f"CPU rehearsal supports {dist} >={bounds[0]},<{bounds[1]}; {version} is installed.",
        hint=f"pip install '{dist}>={bounds[0]},<{bounds[1]}' (or set {ALLOW_UNTESTED_ENV}=1 to try the untested "
        "version at your own risk)",
    )


def check_versions(backend: str) -> None:
    """AccelkitError unless the libraries the shim for `backend` touches are installed in a supported version."""
    _check("accelerate", ACCELERATE_RANGE, "pip install 'accelkit'")
    if backend == "deepspeed":
        _check("deepspeed", DEEPSPEED_RANGE, DEEPSPEED_INSTALL_HINT)
