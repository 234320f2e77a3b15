"""accelkit convert: a libcst codemod that turns a single-device PyTorch training script into an Accelerate one.

    from accelkit.convert import ConvertOptions, convert_source
    result = convert_source(open("train.py").read(), ConvertOptions(mixed_precision="bf16"))
    print(result.report.format("train.py"))

    from accelkit.convert import CheckOptions, check_script   # --check: prove it by running it (check/)
    print(check_script(Path("train.py"), [], CheckOptions(steps=8)).format())

    from accelkit.convert import ConvertRequest, run_convert   # the command as one call (entry.py): write, diff
    result = run_convert(ConvertRequest(Path("train.py"), in_place=True))   # or check; a CommandResult back

The names are loaded on first use: the `--check` probe lives in this package and runs in every rank, which must not
pay for importing libcst.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "MIXED_PRECISION_CHOICES": "api",
    "ConversionResult": "api",
    "ConvertOptions": "api",
    "convert_source": "api",
    "Change": "report",
    "LeftAlone": "report",
    "Report": "report",
    "CheckOptions": "check.api",
    "CheckOutcome": "check.api",
    "check_script": "check.api",
    "ConvertRequest": "entry",
    "run_convert": "entry",
    "BACKUP_SUFFIX": "write",
    "read_script": "write",
    "write_conversion": "write",
})
