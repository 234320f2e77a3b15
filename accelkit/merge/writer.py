"""A streaming safetensors writer: header first, then each tensor's bytes, never the whole file in memory.

The safetensors layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian unsigned
header size N, then N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin,
end]} (offsets relative to the end of the header, tensors packed back to back) plus an optional "__metadata__"
string map; the header is padded with spaces to a multiple of 8 bytes. Since every tensor's name, shape and dtype
are known before any byte is read, the header can be written first and tensors appended one at a time in order.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from accelkit.merge.source import TensorEntry

SAFETENSORS_DTYPES = {
    torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
    torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL", torch.float8_e4m3fn: "F8_E4M3", torch.float8_e5m2: "F8_E5M2",
    torch.uint16: "U16", torch.uint32: "U32", torch.uint64: "U64",
}


def build_header(entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> bytes:
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for e in entries:
        header[e.name] = {"dtype": SAFETENSORS_DTYPES[e.dtype], "shape": list(e.shape),
                          "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def tensor_bytes(tensor: torch.Tensor) -> memoryview:
    """The tensor's raw little-endian bytes, without a copy when it is already contiguous."""
    flat = tensor.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return memoryview(b"")
    return memoryview(flat.view(torch.uint8).numpy())


class SafetensorsWriter:
    """Write `entries` to `path` in this order; `write` must be called once per entry with a matching tensor."""

    def __init__(self, path: Path, entries: list[TensorEntry], metadata: dict[str, str] | None = None) -> None:
        self.path = path
        self._entries = entries
        self._next = 0
        self._file = open(path, "xb")  # noqa: SIM115 - closed in close(); the writer streams across calls
        self._file.write(build_header(entries, metadata))

    def write(self, name: str, tensor: torch.Tensor) -> int:
        expected = self._entries[self._next]
        if name != expected.name or tuple(tensor.shape) != expected.shape or tensor.dtype != expected.dtype:
            raise RuntimeError(f"writer expected {expected.name} {expected.shape} {expected.dtype}, got "
                               f"{name} {tuple(tensor.shape)} {tensor.dtype}")
        self._file.write(tensor_bytes(tensor))
        self._next += 1
        return expected.nbytes

    def close(self) -> None:
        if self._file.closed:
            return
        try:
            if self._next != len(self._entries):
                raise RuntimeError(f"{self.path}: {len(self._entries) - self._next} tensors were never written")
            self._file.flush()
        finally:
            self._file.close()

    def abort(self) -> None:
        self._file.close()
