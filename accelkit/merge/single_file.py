"""Reader for one torch state-dict file (`.bin`, `.pt`, `.pth`), loaded with `weights_only=True`, checksums checked.

Accepts a flat {name: tensor} dict or one nested under "state_dict", "model" or "module" (Lightning, DeepSpeed
consolidated and many training loops save that way). Tensors sharing storage (tied weights) are reported as
aliases. Non-tensor entries are skipped and named in the notes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from accelkit.errors import AccelkitError
from accelkit.merge.source import CheckpointSource, Segment, TensorEntry
from accelkit.merge.torch_files import open_archive, tensor_segments

SUFFIXES = (".bin", ".pt", ".pth")
_NESTED_KEYS = ("state_dict", "model", "module")


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and any(isinstance(v, torch.Tensor) for v in obj.values())


class TorchFileSource(CheckpointSource):
    def __init__(self, path: Path) -> None:
        super().__init__(format_name="torch state dict file", root=path, world_size=1, files=[path])
        self._archive = open_archive(path)
        obj = self._archive.obj
        self._key = None
        if not _is_state_dict(obj) and isinstance(obj, dict):
            self._key = next((k for k in _NESTED_KEYS if _is_state_dict(obj.get(k))), None)
            if self._key is not None:
                self.notes.append(f'state dict nested under "{self._key}"')
        sd = self._state_dict()
        if not _is_state_dict(sd):
            raise AccelkitError(f"{path} holds no tensors at the top level or under "
                                f"{', '.join(_NESTED_KEYS)}", hint="save model.state_dict() with torch.save")
        skipped = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
        if skipped:
            self.notes.append(f"skipped {len(skipped)} non-tensor entries (e.g. {skipped[0]})")
        if self._archive.legacy:
            self.notes.append("a legacy (pre-zip) torch file: it carries no checksums")
        else:
            self.checks.append(f"{path.name}: the CRC-32 of every record read is checked")
        seen: dict[tuple, str] = {}
        for name, t in sd.items():
            if not isinstance(t, torch.Tensor):
                continue
            key = (_storage_key(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if t.numel() and key in seen:
                self.aliases[name] = seen[key]
                continue
            seen[key] = name
            self.entries.append(TensorEntry(name, tuple(t.shape), t.dtype))

    def _state_dict(self) -> dict[str, Any]:
        obj = self._archive.obj
        return obj[self._key] if self._key is not None else obj

    def segments(self, name: str) -> list[Segment]:
        return tensor_segments(self._archive, self.reader, self._state_dict()[name])


def _storage_key(tensor: torch.Tensor) -> object:
    """What identifies a tensor's storage: its record offset on the meta device, its address in memory."""
    storage = tensor.untyped_storage()
    offset = getattr(storage, "_checkpoint_offset", None)
    return offset if offset is not None else storage.data_ptr()
