"""Reader for HuggingFace safetensors checkpoints: `*.safetensors.index.json` + shards, or one `.safetensors` file.

Headers are read with safetensors' `safe_open` when the checkpoint is opened (which also rejects truncated files);
tensors are read one at a time with `get_tensor`, re-opening a file after MAP_WINDOW_BYTES so the memory-mapped
pages do not pile up in RSS.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from accelkit.errors import AccelkitError
from accelkit.merge.source import CheckpointSource, TensorEntry
from accelkit.merge.torch_files import MAP_WINDOW_BYTES
from accelkit.merge.writer import SAFETENSORS_DTYPES

_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}


def find_index(path: Path) -> Path | None:
    if path.is_file() and path.name.endswith(".safetensors.index.json"):
        return path
    if path.is_dir():
        found = sorted(path.glob("*.safetensors.index.json"))
        return found[0] if found else None
    return None


def _open(file: Path):
    from safetensors import safe_open

    try:
        return safe_open(str(file), framework="pt")
    except FileNotFoundError:
        raise AccelkitError(f"shard {file} is missing", hint="copy every shard the index names") from None
    except Exception as exc:
        raise AccelkitError(f"cannot read {file}: it is truncated or corrupt ({str(exc)[:160]})",
                            hint="re-download or re-copy this shard") from None


class SafetensorsSource(CheckpointSource):
    def __init__(self, path: Path) -> None:
        index = find_index(path)
        super().__init__(format_name="HF sharded safetensors" if index else "single safetensors file", root=path)
        if index is not None:
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise AccelkitError(f"cannot read {index}: not a safetensors index ({exc})",
                                    hint="the index must be JSON with a weight_map") from None
            self.notes.append(f"index {index.name} names {len(set(weight_map.values()))} shard files")
            files = list(dict.fromkeys(index.parent / f for f in weight_map.values()))
            self.files = [index, *files]
        else:
            files = [path]
            self.files = [path]
        self._file_of: dict[str, Path] = {}
        for file in files:
            handle = _open(file)
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not iterable
                if index is not None and weight_map.get(name) != file.name:
                    continue
                sl = handle.get_slice(name)
                dtype = _DTYPES.get(sl.get_dtype())
                if dtype is None:
                    raise AccelkitError(f"{file}: tensor {name!r} has unsupported dtype {sl.get_dtype()}",
                                        hint="convert that tensor with safetensors first")
                self.entries.append(TensorEntry(name, tuple(sl.get_shape()), dtype))
                self._file_of[name] = file
            del handle
        if index is not None:
            missing = [n for n in weight_map if n not in self._file_of]
            if missing:
                raise AccelkitError(f"{index.name} names {len(missing)} tensors that are not in their shard "
                                    f"(e.g. {missing[0]!r} in {weight_map[missing[0]]})",
                                    hint="the shards and the index come from different saves")
        self._handles: dict[Path, object] = {}
        self._read_since_open: dict[Path, int] = {}

    def read(self, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        by_name = self.entry_by_name
        for name in names:
            file = self._file_of[name]
            if file not in self._handles:
                self._handles[file] = _open(file)
                self._read_since_open[file] = 0
            try:
                tensor = self._handles[file].get_tensor(name).clone()
            except Exception as exc:
                raise AccelkitError(f"cannot read {name!r} from {file}: {str(exc)[:160]}",
                                    hint="re-copy this shard") from None
            self._read_since_open[file] += by_name[name].nbytes
            if self._read_since_open[file] >= MAP_WINDOW_BYTES:
                del self._handles[file]
            yield name, tensor

    def close(self) -> None:
        self._handles.clear()
