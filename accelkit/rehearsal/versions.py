"""The one table of library versions the rehearsal shim is known to work with, and the check that enforces it.

The shim reaches into Accelerate's state set-up (see shim.py), so it is only trusted on the versions it was tested
on. An untested version is refused with a clear message instead of silently producing a run that is not what the
user asked for; ACCELKIT_REHEARSAL_ALLOW_UNTESTED=1 lets a user try anyway. pyproject.toml's lower bounds and the
launch page (docs/commands/launch.md) state the same ranges (a test keeps them in step with this table).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from accelkit.envinfo import installed_version
from accelkit.errors import AccelkitError

ALLOW_UNTESTED_ENV = "ACCELKIT_REHEARSAL_ALLOW_UNTESTED"
DEEPSPEED_INSTALL_HINT = "pip install 'accelkit[deepspeed]' (or: pip install deepspeed)"


@dataclass(frozen=True)
class Supported:
    """A distribution's supported range [low, high) and the versions it was tested with."""

    dist: str
    low: str
    high: str
    tested: tuple[str, ...]
    install_hint: str

    def __str__(self) -> str:
        return f"{self.dist} >={self.low},<{self.high}"

    def admits(self, version: str) -> bool:
        from packaging.version import InvalidVersion, Version

        try:
            # Compare the release only, so 1.15.0.dev0 or 0.19.8+cpu count as their release.
            release = Version(Version(version).base_version)
        except InvalidVersion:
            return False
        return Version(self.low) <= release < Version(self.high)


SUPPORTED = {
    # Tested with torch 2.13 CPU (FSDP2 and DeepSpeed ZeRO-3 probes: sharding, save_state, load_state). 1.10.1 and
    # 1.12.0 run DeepSpeed, but their FSDP2 load_state fails ("Missing key in checkpoint state_dict:
    # optimizer.state.0.step"; Accelerate saved the optimizer with optimizer.state_dict() before 1.13, not a CPU
    # issue), so rehearsal starts at 1.13. The two hooks used (PartialState._prepare_backend and
    # AcceleratorState.__init__) have the same shape across that range.
    "accelerate": Supported("accelerate", "1.13.0", "1.16.0", ("1.13.0", "1.14.0", "1.15.0"), "pip install 'accelkit'"),
    # With DS_ACCELERATOR=cpu: ZeRO-1/2/3 over gloo.
    "deepspeed": Supported("deepspeed", "0.19.0", "0.20.0", ("0.19.8",), DEEPSPEED_INSTALL_HINT),
}


def _check(supported: Supported) -> None:
    version = installed_version(supported.dist)
    if version is None:
        raise AccelkitError(f"CPU rehearsal needs {supported.dist}, which is not installed.",
                            hint=supported.install_hint)
    if supported.admits(version) or os.environ.get(ALLOW_UNTESTED_ENV) == "1":
        return
    raise AccelkitError(
        f"CPU rehearsal supports {supported}; {version} is installed.",
        hint=f"pip install '{supported.dist}>={supported.low},<{supported.high}' (or set {ALLOW_UNTESTED_ENV}=1 to "
             "try the untested version at your own risk)",
    )


def check_versions(backend: str) -> None:
    """AccelkitError unless the libraries the shim for `backend` touches are installed in a supported version."""
    _check(SUPPORTED["accelerate"])
    if backend == "deepspeed":
        _check(SUPPORTED["deepspeed"])
