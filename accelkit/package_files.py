"""What installed packages' own files say, read without importing them: which file a package has, whether it defines
or imports a name. The launch, `config --check` and each rank ask it about version gaps (accelkit.configs.compat
says what a layout needs; accelkit.ranks.fsdp2_tp_compat patches where a gap has a workaround)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path


def package_file(package: str, *parts: str) -> Path | None:
    """A file inside an installed package, found without importing it (None when the package is missing)."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        path = Path(root, *parts)
        if path.exists():
            return path
    return None


def defines(path: Path | None, name: str) -> bool:
    if path is None or not path.is_file():
        return False
    text = path.read_text(encoding="utf-8", errors="replace")
    return re.search(rf"^\s*(class|def)\s+{name}\b|^\s*{name}\s*=", text, re.MULTILINE) is not None


def imports_name(path: Path | None, name: str) -> bool:
    if path is None or not path.is_file():
        return False
    return re.search(rf"\bimport\s+(\([^)]*)?\b{name}\b", path.read_text(encoding="utf-8", errors="replace")) \
        is not None


def replicate_parallel_missing() -> bool:
    """Accelerate's FSDP2+TP preparation imports a transformers class the installed transformers lacks."""
    accelerator = package_file("accelerate", "accelerator.py")
    if not imports_name(accelerator, "ReplicateParallel"):
        return False
    return not defines(package_file("transformers", "integrations", "tensor_parallel.py"), "ReplicateParallel")


def tp_plan_applicable() -> bool:
    """The installed transformers can apply a model's TP plan to a loaded model over any mesh (what accelkit's
    workaround, accelkit.ranks.fsdp2_tp_compat, uses): `distributed.tensor_parallel.apply_tensor_parallelism`."""
    return defines(package_file("transformers", "distributed", "tensor_parallel.py"), "apply_tensor_parallelism")


def fsdp2_tp_workaround_needed() -> bool:
    """FSDP2 x TP runs here only through accelkit's workaround: Accelerate imports the removed ReplicateParallel and
    this transformers has what the workaround needs instead. False with compatible versions (nothing is patched)."""
    return replicate_parallel_missing() and tp_plan_applicable()
