"""accelkit convert: a libcst codemod that turns a single-device PyTorch training script into an Accelerate one.

    from accelkit.convert.codemod import ConvertOptions, convert_source   # the codemod itself (codemod.py)
    result = convert_source(open("train.py").read(), ConvertOptions(mixed_precision="bf16"))
    print(result.report.format("train.py"))

    from accelkit.convert.check.run_check import CheckOptions, check_script   # --check (check/run_check.py)
    print(check_script(Path("train.py"), [], CheckOptions(steps=8)).format())

    from accelkit.convert import ConvertRequest, run_convert   # the command as one call (entry.py): write, diff
    result = run_convert(ConvertRequest(Path("train.py"), in_place=True))   # or check; a CommandResult back

The names are loaded on first use: the `--check` probe lives in this package and runs in every rank, which must not
pay for importing libcst.
"""

from __future__ import annotations

from accelkit.exports import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ConvertRequest": "entry",
    "run_convert": "entry",
})
