"""Loading torch pickles safely and in bounded memory.

Every `.pt`/`.bin` is loaded with `weights_only=True`: torch's restricted unpickler, never arbitrary code. DeepSpeed
pickles name three of its own small classes; they are allowlisted under their dotted names and rebuilt as inert
stand-ins, so no DeepSpeed code runs (and DeepSpeed need not even be installed to merge its checkpoints).

Files are memory-mapped (`mmap=True`): a tensor's bytes are read only when touched. Pages touched through a map
stay in the process's RSS until the map goes away, so `MappedTorchFile` re-opens the file after a byte budget has
been read through it; the old map is dropped and memory stays bounded however large the file is.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from accelkit.errors import AccelkitError

# Window of bytes read through one map before it is dropped and the file re-opened.
MAP_WINDOW_BYTES = 32 * 1024 * 1024


class _StandIn:
    """An inert object standing in for an allowlisted foreign class: it only keeps the state it was given."""

    def __init__(self, *args: Any) -> None:
        self.args = args

    def __setstate__(self, state: Any) -> None:
        self.state = state

    @property
    def value(self) -> Any:
        """The enum value for enum stand-ins (pickled as a call with the value)."""
        return self.args[0] if self.args else None


def _stand_in(dotted: str) -> type:
    return type(dotted.rsplit(".", 1)[1], (_StandIn,), {"__module__": dotted.rsplit(".", 1)[0]})


# The only non-torch classes DeepSpeed ZeRO checkpoints contain (deepspeed 0.14 - 0.19).
ALLOWED_FOREIGN_CLASSES = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
_SAFE_GLOBALS = [(_stand_in(name), name) for name in ALLOWED_FOREIGN_CLASSES]


def load_pickle(path: Path, *, mmap: bool = True) -> Any:
    """torch.load with weights_only=True, the allowlist above, and a one-line AccelkitError for any bad file."""
    try:
        with torch.serialization.safe_globals(_SAFE_GLOBALS):
            try:
                return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
            except RuntimeError as exc:
                # Legacy (pre-zipfile) pickles cannot be memory-mapped; load them whole.
                if mmap and "mmap" in str(exc) and not zipfile.is_zipfile(path):
                    return torch.load(path, map_location="cpu", weights_only=True)
                raise
    except FileNotFoundError:
        raise AccelkitError(f"checkpoint file is missing: {path}",
                            hint="copy the complete checkpoint (every rank's files) and try again") from None
    except Exception as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if "Unsupported global" in str(exc) or "weights_only" in str(exc):
            raise AccelkitError(f"{path} contains objects outside the safe allowlist ({first_line[:160]})",
                                hint="merge-ckpt loads pickles with weights_only=True and never runs pickled "
                                     "code; re-save the state dict with plain tensors") from None
        raise AccelkitError(f"cannot read {path}: it is truncated or corrupt ({first_line[:160]})",
                            hint="re-copy this file from the machine that wrote the checkpoint") from None


class MappedTorchFile:
    """A memory-mapped torch pickle whose map is renewed every MAP_WINDOW_BYTES bytes read through it."""

    def __init__(self, path: Path, window: int = MAP_WINDOW_BYTES) -> None:
        self.path = path
        self.window = window
        self._obj: Any = None
        self._read_since_open = 0

    def get(self) -> Any:
        if self._obj is None:
            self._obj = load_pickle(self.path)
            self._read_since_open = 0
        return self._obj

    def copy_out(self, tensor: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
        """Copy a (mapped) tensor or view into ordinary memory (`into`, or a new tensor); count the bytes read."""
        # detach: DeepSpeed saves its fp32 partitions with requires_grad=True, and an autograd edge from the copy
        # would keep the whole mapped file alive (and its touched pages in RSS).
        tensor = tensor.detach()
        out = tensor.clone() if into is None else into.copy_(tensor)
        self._read_since_open += out.numel() * out.element_size()
        if self._read_since_open >= self.window:
            self.close()
        return out

    def close(self) -> None:
        self._obj = None
