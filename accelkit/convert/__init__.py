"""accelkit convert: a libcst codemod that turns a single-device PyTorch training script into an Accelerate one.

    from accelkit.convert import ConvertOptions, convert_source
    result = convert_source(open("train.py").read(), ConvertOptions(mixed_precision="bf16"))
    print(result.report.format("train.py"))

The names are loaded on first use: the `--check` probe lives in this package and runs in every rank, which must not
pay for importing libcst.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MIXED_PRECISION_CHOICES": "accelkit.convert.api", "ConversionResult": "accelkit.convert.api",
    "ConvertOptions": "accelkit.convert.api", "convert_source": "accelkit.convert.api",
    "Change": "accelkit.convert.report", "LeftAlone": "accelkit.convert.report", "Report": "accelkit.convert.report",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
