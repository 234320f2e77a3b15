"""The one dtype table of the merge, by torch's names (no torch): safetensors codes, sizes, `--dtype` choices.

Every reader names a tensor's dtype as torch does ("float32", "bfloat16", ...); the torch adapters turn a name into
a `torch.dtype` with `getattr(torch, name)` and back with `name_of`. `STORAGES` names the typed storage classes
`torch.save` pickles for the dtypes the torch-free readers rebuild.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DTypeInfo:
    code: str  # safetensors' name
    itemsize: int
    floating: bool
    storage: str | None = None  # the typed storage class torch.save names (None: read with torch only)


TABLE: dict[str, DTypeInfo] = {
    "float64": DTypeInfo("F64", 8, True, "DoubleStorage"),
    "float32": DTypeInfo("F32", 4, True, "FloatStorage"),
    "float16": DTypeInfo("F16", 2, True, "HalfStorage"),
    "bfloat16": DTypeInfo("BF16", 2, True, "BFloat16Storage"),
    "int64": DTypeInfo("I64", 8, False, "LongStorage"),
    "int32": DTypeInfo("I32", 4, False, "IntStorage"),
    "int16": DTypeInfo("I16", 2, False, "ShortStorage"),
    "int8": DTypeInfo("I8", 1, False, "CharStorage"),
    "uint8": DTypeInfo("U8", 1, False, "ByteStorage"),
    "bool": DTypeInfo("BOOL", 1, False, "BoolStorage"),
    "float8_e4m3fn": DTypeInfo("F8_E4M3", 1, True),
    "float8_e5m2": DTypeInfo("F8_E5M2", 1, True),
    "uint16": DTypeInfo("U16", 2, False),
    "uint32": DTypeInfo("U32", 4, False),
    "uint64": DTypeInfo("U64", 8, False),
}
# The dtypes the torch-free readers rebuild from a pickle (those torch.save names a typed storage class for).
LIGHT: dict[str, DTypeInfo] = {name: info for name, info in TABLE.items() if info.storage}
STORAGES: dict[str, str] = {info.storage: name for name, info in LIGHT.items() if info.storage}
BY_CODE: dict[str, str] = {info.code: name for name, info in TABLE.items()}
COMPLEX: dict[str, int] = {"complex32": 4, "complex64": 8, "complex128": 16}  # item sizes; safetensors has none
# --dtype: what floating-point tensors are cast to (None: kept as they are).
CAST: dict[str, str | None] = {"keep": None, "fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# What the non-finite scan reads (float8 has no inf and is written as read).
SCANNED = ("float64", "float32", "float16", "bfloat16")


def name_of(dtype: object) -> str:
    """torch's name of a dtype object (`torch.float32` -> "float32"), without importing torch."""
    return str(dtype).removeprefix("torch.")
