"""Opening torch pickles safely, and turning the tensors inside them into byte segments.

Every `.pt`/`.bin` is loaded with `weights_only=True` (torch's restricted unpickler, never arbitrary code) on the meta
device (see records: no tensor byte is read until the merge needs it, and then through its CRC-32). DeepSpeed
pickles name a few of its own small classes; they are allowlisted under their dotted names and rebuilt as inert
stand-ins, so no DeepSpeed code runs (and DeepSpeed need not even be installed to merge its checkpoints).
"""

from __future__ import annotations

from pathlib import Path

import torch

from accelkit.merge.light_pickle import ForeignStandIn
from accelkit.merge.records import RecordReader, TorchArchive
from accelkit.merge.source import Segment, lazy_segment, record_segment, tensor_segment


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
        return [tensor_segment(tensor.detach().reshape(-1)[begin:end])]
    size = tensor.element_size()
    if tensor.is_contiguous():
        record, offset = archive.locate(tensor)
        return [record_segment(reader, record, offset + begin * size, (end - begin) * size)]
    return [lazy_segment((end - begin) * size, lambda: materialise(archive, reader, tensor).reshape(-1)[begin:end])]


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


def peek_flat(archive: TorchArchive, reader: RecordReader, tensor: torch.Tensor, index: int) -> torch.Tensor:
    """One element of a contiguous tensor, read without reading (or checksumming) the rest of its record."""
    if archive.legacy:
        return tensor.detach().reshape(-1)[index]
    record, offset = archive.locate(tensor)
    out = torch.empty(tensor.element_size(), dtype=torch.uint8)
    reader.peek(record, offset + index * tensor.element_size(), memoryview(out.numpy()))
    return out.view(tensor.dtype)[0]
