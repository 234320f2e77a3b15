"""Reader for HuggingFace safetensors checkpoints: `*.safetensors.index.json` + shards, or one `.safetensors` file.

Each file is opened with safetensors' `safe_open` first (which rejects truncated or malformed files). Tensor bytes
are then read straight from the file at the offsets its header gives (an 8-byte length, a JSON header, the data:
see writer), in pieces, like every other format. safetensors files carry no checksum: bit rot inside them cannot be
detected unless a manifest lists their sha256.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from accelkit.errors import AccelkitError, clip
from accelkit.merge.dtypes import BY_CODE
from accelkit.merge.records import RecordReader, input_read_error
from accelkit.merge.source import CheckpointSource, FileRange, Tensor

MAX_HEADER_BYTES = 100_000_000  # the limit safetensors itself enforces


def find_index(path: Path) -> Path | None:
    if path.is_file() and path.name.endswith(".safetensors.index.json"):
        return path
    if path.is_dir():
        found = sorted(path.glob("*.safetensors.index.json"))
        return found[0] if found else None
    return None


def _validate(file: Path) -> None:
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt"):
            pass
    except FileNotFoundError:
        raise AccelkitError(f"shard {file} is missing", hint="copy every shard the index names") from None
    except OSError as exc:
        raise input_read_error(exc, file) from None
    except Exception as exc:
        raise AccelkitError(f"cannot read {file}: it is truncated or corrupt ({clip(str(exc), 200)})",
                            hint="re-download or re-copy this shard") from None


def read_header(file: Path) -> tuple[dict, int]:
    """The JSON header of a safetensors file and the byte offset where its data starts."""
    try:
        with open(file, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER_BYTES:
                raise ValueError("header size out of range")
            header = json.loads(handle.read(size))
    except OSError as exc:
        raise input_read_error(exc, file) from None
    except (struct.error, ValueError, MemoryError) as exc:
        raise AccelkitError(f"cannot read {file}: its header is corrupt ({type(exc).__name__})",
                            hint="re-download or re-copy this shard") from None
    return header, 8 + size


class SafetensorsSource(CheckpointSource):
    def __init__(self, path: Path, reader: RecordReader) -> None:
        index = find_index(path)
        super().__init__(format_name="HF sharded safetensors" if index else "single safetensors file", root=path,
                         reader=reader)
        if index is not None:
            try:
                weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
            except OSError as exc:
                raise input_read_error(exc, index) from None
            except (ValueError, KeyError, TypeError) as exc:
                raise AccelkitError(f"cannot read {index}: not a safetensors index ({exc})",
                                    hint="the index must be JSON with a weight_map") from None
            self.notes.append(f"index {index.name} names {len(set(weight_map.values()))} shard files")
            files = list(dict.fromkeys(index.parent / f for f in weight_map.values()))
            self.files = [index, *files]
        else:
            files = [path]
            self.files = [path]
        for file in files:
            _validate(file)
            header, data_start = read_header(file)
            for name, info in header.items():
                if name == "__metadata__" or (index is not None and weight_map.get(name) != file.name):
                    continue
                if info["dtype"] not in BY_CODE:
                    raise AccelkitError(f"{file}: tensor {name!r} has unsupported dtype {info['dtype']}",
                                        hint="convert that tensor with safetensors first")
                begin, end = info["data_offsets"]
                self.tensors.append(Tensor(name, BY_CODE[info["dtype"]], tuple(info["shape"]),
                                           [FileRange(file, data_start + begin, end - begin)]))
        if index is not None:
            found = {t.name for t in self.tensors}
            missing = [n for n in weight_map if n not in found]
            if missing:
                raise AccelkitError(f"{index.name} names {len(missing)} tensors that are not in their shard "
                                    f"(e.g. {missing[0]!r} in {weight_map[missing[0]]})",
                                    hint="the shards and the index come from different saves")
        self.checks.append(f"safetensors: {len(files)} headers valid (the format carries no checksum)")
