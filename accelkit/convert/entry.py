"""`accelkit convert` as one library call: convert SCRIPT and write it (beside it, to a path, in place with a backup),
show the diff, or prove a conversion with --check. Light at import: libcst loads only when a conversion runs."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from accelkit.command_result import CommandResult
from accelkit.errors import AccelkitError
from accelkit.shellwords import command_line

CHECK_PROCESSES = 2  # the converted script's run in --check, and the `Try it` command's


@dataclass(frozen=True)
class ConvertRequest:
    """What `accelkit convert` was asked (the mode checks are the CLI's: at most one of output/in_place/diff/check)."""

    script: Path
    output: Path | None = None
    in_place: bool = False
    diff: bool = False
    exit_code: bool = False  # with diff: 1 when there is something to convert
    mixed_precision: str | None = None
    grad_compression: str | None = None  # compression/compression_spec.py's text: a DDP comm hook in Accelerator()
    partial: bool = False  # write even when parts could not be converted
    force: bool = False
    # --check: run the original on 1 process and the conversion (or `converted`) on CHECK_PROCESSES
    check: bool = False
    script_args: tuple[str, ...] = ()
    converted: Path | None = None
    steps: int = 8
    stall_timeout: float = 60
    sandbox_limit: str = "1GiB"
    backend: str = "ddp"


def run_convert(request: ConvertRequest, progress: Callable[[str], None] = print) -> CommandResult:
    """Convert, diff or check; `progress`: what is said before a long --check starts."""
    if request.check:
        return check_conversion(request, progress)
    from accelkit.convert.codemod import ConvertOptions, convert_source
    from accelkit.convert.report import partial_line
    from accelkit.convert.write import read_script, write_conversion

    script, result = request.script, CommandResult()
    source = read_script(script)
    options = ConvertOptions(mixed_precision=request.mixed_precision, grad_compression=request.grad_compression)
    conversion = convert_source(source, options, filename=script.name, directory=script.resolve().parent)
    report = conversion.report.format(script.name)
    problems = conversion.report.problems
    if request.diff:
        result.out("".join(difflib.unified_diff(source.splitlines(keepends=True),
                                                conversion.code.splitlines(keepends=True), fromfile=str(script),
                                                tofile=f"{script} (converted)")), nl=False).err(report)
        if problems:
            result.err(partial_line(problems))
        result.exit_code = 1 if request.exit_code and conversion.changed else 0
        return result
    if conversion.report.status == "trainer":  # one line: how to launch it as it is
        return result.out(report)
    if not conversion.changed and not problems:
        return result.out(report).out("Nothing written.")
    if problems and not request.partial:
        result.out(report).error = AccelkitError(
            f"{script.name} cannot be converted completely: {problems[0].format()}"
            + (f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""),
            hint="fix these in the original and convert again, or pass --partial to write the conversion with them "
                 "left to do; nothing was written")
        return result
    if not conversion.changed:
        return result.out(report).out("Nothing written.")
    written = write_conversion(script, source, conversion.code, output=request.output, in_place=request.in_place,
                               force=request.force)
    result.out(report)
    if written.backup is not None:
        result.out(f"Rewrote {script} (original kept in {written.backup}).")
    else:
        result.out(f"Wrote {written.path}.{' Problems left: see NOT CONVERTED above.' if problems else ''}")
    result.out(f"Try it: {try_it(written.path)}")
    # a partial conversion says so last: the parts left undone train wrongly on several processes until fixed
    return result.out(partial_line(problems)) if problems else result


def try_it(path: Path) -> str:
    """The command that runs a converted script on 2 CPU processes, exactly as it can be pasted."""
    return command_line("accelkit", "launch", flags=[("--cpu", True), ("--num-processes", CHECK_PROCESSES)],
                        args=[path])


def check_conversion(request: ConvertRequest, progress: Callable[[str], None]) -> CommandResult:
    """--check: the original on 1 process, the conversion on CHECK_PROCESSES, invariant by invariant."""
    from accelkit.convert.check.run_check import CheckOptions, check_script
    from accelkit.convert.write import read_script
    from accelkit.sizes import parse_bytes

    limit = parse_bytes(request.sandbox_limit, "--sandbox-limit")
    script, args, steps, backend, converted = (request.script, list(request.script_args), request.steps,
                                               request.backend, request.converted)
    what = converted.name if converted is not None else "the conversion"
    progress(f"accelkit convert --check {script.name}: the original on 1 process, {what} on {CHECK_PROCESSES} CPU "
             f"processes ({backend.upper()} rehearsal), {steps} step(s), each in a copy of the working directory...")
    outcome = check_script(script, args, CheckOptions(steps=steps, processes=CHECK_PROCESSES,
                                                      stall_seconds=request.stall_timeout, sandbox_limit=limit,
                                                      backend=backend),
                           converted_code=read_script(converted) if converted is not None else None,
                           converted_name=converted.name if converted is not None else None)
    result = CommandResult()
    if outcome.conversion_problems:
        result.out("The conversion left problems (NOT CONVERTED in its report):")
        for problem in outcome.conversion_problems:
            result.out(f"  {problem}")
    result.out(outcome.format())
    with result.ends_on_error():
        outcome.raise_unless_passed(script, args, steps)
    if result.error is not None:
        return result
    skipped = "; ".join(f"{v.name} ({v.summary})" for v in outcome.not_checked)
    return result.out(f"Check passed: the converted {script.name} trains the same model on {CHECK_PROCESSES} "
                      f"processes ({backend.upper()}) as the original on one. Checked: {', '.join(outcome.checked)}."
                      + (f" Not checked: {skipped}." if skipped else ""))
