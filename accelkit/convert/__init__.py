"""accelkit convert: a libcst codemod that turns a single-device PyTorch training script into an Accelerate one.

    from accelkit.convert import ConvertOptions, convert_source
    result = convert_source(open("train.py").read(), ConvertOptions(mixed_precision="bf16"))
    print(result.report.format("train.py"))
"""

from accelkit.convert.api import MIXED_PRECISION_CHOICES, ConversionResult, ConvertOptions, convert_source
from accelkit.convert.report import Change, LeftAlone, Report

__all__ = ["MIXED_PRECISION_CHOICES", "Change", "ConversionResult", "ConvertOptions", "LeftAlone", "Report",
           "convert_source"]
