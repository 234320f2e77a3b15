"""The torch adapter of the merge: torch pickles opened safely, the reader of one torch state-dict file, segments
torch materialises, and `--dtype`'s cast.

Every `.pt`/`.bin` is loaded with `weights_only=True` (torch's restricted unpickler, never arbitrary code) on the meta
device (see records: no tensor byte is read until the merge needs it, and then through its CRC-32). DeepSpeed
pickles name a few of its own small classes; they are allowlisted under their dotted names and rebuilt as inert
stand-ins, so no DeepSpeed code runs. A state-dict file (`.bin`, `.pt`, `.pth`) may be a flat {name: tensor} dict or
one nested under "state_dict", "model" or "module"; tensors sharing storage (tied weights) are reported as aliases,
non-tensor entries named in the notes.
"""

from __future__ import annotations

import contextlib
import gc
import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from accelkit.errors import AccelkitError
from accelkit.merge.dtypes import TABLE, name_of
from accelkit.merge.light_pickle import ForeignStandIn
from accelkit.merge.records import RecordReader, TorchArchive, ZipRecord
from accelkit.merge.source import CheckpointSource, Materialised, RecordRange, Segment, Tensor

_NESTED_KEYS = ("state_dict", "model", "module")


def _is_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and any(isinstance(v, torch.Tensor) for v in obj.values())


class TorchFileSource(CheckpointSource):
    def __init__(self, path: Path, reader: RecordReader) -> None:
        super().__init__(format_name="torch state dict file", root=path, world_size=1, files=[path], reader=reader)
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
            key = (storage_identity(t), t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)
            if t.numel() and key in seen:
                self.aliases[name] = seen[key]
                continue
            seen[key] = name
            self.tensors.append(torch_tensor(name, t, tensor_segments(self._archive, self.reader, t)))

    def _state_dict(self) -> dict[str, Any]:
        obj = self._archive.obj
        return obj[self._key] if self._key is not None else obj


def torch_tensor(name: str, tensor: torch.Tensor, segments: list[Segment]) -> Tensor:
    """The one tensor model for a torch tensor's name, shape and dtype (any dtype torch has: safetensors' own
    limits are checked when the output is planned)."""
    return Tensor(name, name_of(tensor.dtype), tuple(tensor.shape), segments, tensor.element_size())


def storage_identity(tensor: torch.Tensor) -> object:
    """What identifies a tensor's storage: its record offset on the meta device, its address in memory."""
    storage = tensor.untyped_storage()
    offset = getattr(storage, "_checkpoint_offset", None)
    return offset if offset is not None else storage.data_ptr()


def _stand_in(dotted: str) -> type:
    return type(dotted.rsplit(".", 1)[1], (ForeignStandIn,), {"__module__": dotted.rsplit(".", 1)[0]})


# The only non-torch classes DeepSpeed ZeRO checkpoints contain (deepspeed 0.14 - 0.19).
ALLOWED_FOREIGN_CLASSES = (
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
)
SAFE_GLOBALS = [(_stand_in(name), name) for name in ALLOWED_FOREIGN_CLASSES]


def open_archive(path: Path) -> TorchArchive:
    """The structure of a torch pickle (tensors on the meta device) and its record table."""
    return TorchArchive.open(path, SAFE_GLOBALS)


def tensor_segments(archive: TorchArchive, reader: RecordReader, tensor: torch.Tensor, begin: int = 0,
                    end: int | None = None) -> list[Segment]:
    """Elements [begin, end) of a tensor from `archive` (flattened, C order), as byte segments."""
    end = tensor.numel() if end is None else end
    if end <= begin:
        return []
    if archive.legacy:
        flat = tensor.detach().reshape(-1)[begin:end]
        return [materialised(flat.numel() * flat.element_size(), lambda: flat)]
    size = tensor.element_size()
    if tensor.is_contiguous():
        record, offset = archive.locate(tensor)
        return [RecordRange(record, offset + begin * size, (end - begin) * size)]
    return [materialised((end - begin) * size, lambda: materialise(archive, reader, tensor).reshape(-1)[begin:end])]


def materialised(nbytes: int, build: Callable[[], torch.Tensor]) -> Materialised:
    """A segment torch builds as a whole (a layout no byte range covers), built when first read and let go after
    its last byte."""
    cache: dict[str, torch.Tensor] = {}

    def fill(start: int, dest: memoryview) -> None:
        if "t" not in cache:
            cache["t"] = build().detach().contiguous().reshape(-1).view(torch.uint8)
        torch.frombuffer(dest, dtype=torch.uint8).copy_(cache["t"][start:start + len(dest)])
        if start + len(dest) >= nbytes:
            cache.clear()  # the last piece: let the tensor go

    return Materialised(nbytes, fill)


def materialise(archive: TorchArchive, reader: RecordReader, tensor: torch.Tensor) -> torch.Tensor:
    """A tensor of `archive` read into memory (checksummed), with its saved shape and strides."""
    if archive.legacy:
        return tensor.detach()
    if tensor.numel() == 0:
        return torch.empty(tensor.shape, dtype=tensor.dtype)
    record, offset = archive.locate(tensor)
    span = 1 + sum((n - 1) * s for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    raw = torch.empty(span * tensor.element_size(), dtype=torch.uint8)
    reader.read(record, offset, memoryview(raw.numpy()))
    return torch.as_strided(raw.view(tensor.dtype), tensor.shape, tensor.stride())


def strided(reader: RecordReader, record: ZipRecord, offset: int, dtype: str, shape: tuple[int, ...],
            stride: tuple[int, ...]) -> torch.Tensor:
    """A tensor stored with strides (no byte range is its contiguous bytes), read through its record's CRC-32."""
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride, strict=True)) if math.prod(shape) else 0
    raw = torch.empty(span * TABLE[dtype].itemsize, dtype=torch.uint8)
    reader.read(record, offset, memoryview(raw.numpy()))
    return torch.as_strided(raw.view(getattr(torch, dtype)), shape, stride)


def open_file_source(path: Path, reader: RecordReader, safetensors: bool) -> CheckpointSource:
    """The reader of a safetensors file or index (hf_sharded) or of one torch state-dict file."""
    from accelkit.merge.hf_sharded import SafetensorsSource

    return SafetensorsSource(path, reader) if safetensors else TorchFileSource(path, reader)


def cast(data: memoryview, stored: str, target: str, dest: memoryview) -> None:
    """`--dtype`: the `stored` values of `data` as `target` values in `dest`, as torch's `.to` makes them (torch warns
    that a mapped window is read-only: it is only read)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        values = torch.frombuffer(data, dtype=getattr(torch, stored))
    torch.frombuffer(dest, dtype=getattr(torch, target)).copy_(values)


@contextlib.contextmanager
def lean_process():
    """What a streaming copy needs from the process, restored afterwards (for in-process callers).

    One torch thread: every operation here (a cast, a chunk placed) runs at memory speed, and idle OpenMP workers spin
    on the second core the writer thread needs. No cyclic garbage collection: the merge makes no cycles, and
    collections triggered by unpickling thousands of small metadata objects cost more than the merge of a small
    model."""
    threads, collecting = torch.get_num_threads(), gc.isenabled()
    torch.set_num_threads(1)
    gc.disable()
    try:
        with torch.no_grad():
            yield
    finally:
        torch.set_num_threads(threads)
        if collecting:
            gc.enable()
