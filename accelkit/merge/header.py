"""The safetensors header, from plain values (no torch): what the streaming writer and the torch-free path share.

Layout (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian unsigned header size N, then
N bytes of UTF-8 JSON mapping each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets relative
to the end of the header, tensors packed back to back) plus an optional "__metadata__" string map; the header is
padded with spaces to a multiple of 8 bytes.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable


def safetensors_header(tensors: Iterable[tuple[str, str, tuple[int, ...], int]],
                       metadata: dict[str, str] | None = None) -> bytes:
    """The header for (name, dtype code, shape, nbytes) of each tensor, in file order."""
    header: dict[str, object] = {}
    if metadata:
        header["__metadata__"] = metadata
    offset = 0
    for name, code, shape, nbytes in tensors:
        header[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw
