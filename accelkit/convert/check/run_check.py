"""`check_script`: convert a script, run the original on one process and the conversion on N CPU ranks, and judge
the invariants of data parallelism (one verdict each)."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from accelkit.convert.check.cuda_on_cpu import failed_for_cuda, rehearsal_env
from accelkit.convert.check.equivalence import Equivalence, compare_weights
from accelkit.convert.check.invariants import FAIL, PASS, SKIP, Runs, Verdict, evaluate
from accelkit.convert.check.lines import ConvertedLines
from accelkit.convert.check.record import replay_order
from accelkit.convert.check.runs import RunResult, Scratch, converted_spec, equivalence_spec, original_spec, run
from accelkit.convert.check.sandbox import DEFAULT_LIMIT, plan_sandbox
from accelkit.convert.check.torchrun_env import needs_launcher, one_process_env
from accelkit.errors import AccelkitError
from accelkit.shellwords import command_line

CHECK_BACKENDS = ("ddp", "fsdp")
REHEARSED_LINE = ("the original is written for a GPU and this machine has none: it ran with its CUDA calls "
                  "rehearsed on the CPU (cuda devices, .cuda(), nccl, DataParallel, torch.cuda queries)")


@dataclass(frozen=True)
class CheckOptions:
    steps: int = 8  # optimizer steps of the converted run (the original runs world * steps)
    processes: int = 2
    stall_seconds: float = 60.0  # no progress this long in a process = a hang
    timeout: float = 1800.0  # wall time limit of each run
    sandbox_limit: int = DEFAULT_LIMIT  # bytes of the working directory the check copies at most (sandbox.py)
    backend: str = "ddp"  # the converted run's rehearsal: "ddp" or "fsdp" (fully_shard, FSDP2)


@dataclass
class CheckOutcome:
    script: str
    verdicts: list[Verdict]
    original: RunResult | None = None
    converted: RunResult | None = None
    conversion_problems: list[str] = field(default_factory=list)
    torchrun: bool = False  # the original ran under a 1-process torchrun environment (torchrun_env.py)
    cuda_rehearsed: bool = False  # the original ran with its CUDA calls rehearsed on the CPU (cuda_on_cpu.py)

    @property
    def passed(self) -> bool:
        return all(v.status != FAIL for v in self.verdicts)

    @property
    def original_failure(self) -> str | None:
        """`exit status 1: ValueError: boom` when the original itself failed on its one process."""
        if self.original is None or self.original.status in (0, None):
            return None
        return f"exit status {self.original.status}: {_last_error(self.original)}"

    @property
    def trained_nothing(self) -> bool:
        """The original ran to its end without one training step: no invariant could be checked."""
        return (self.original is not None and self.original.status == 0 and not _took_a_step(self.original))

    @property
    def checked(self) -> list[str]:
        return [v.name for v in self.verdicts if v.status == PASS]

    @property
    def not_checked(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == SKIP]

    @property
    def failed(self) -> list[Verdict]:
        return [v for v in self.verdicts if v.status == FAIL]

    def raise_unless_passed(self, script: Path, args: list[str], steps: int) -> None:
        """Raise the one error that says why the check did not pass: the original's own failure first, then a check
        that checked nothing, then a limit of the check (with the flag that lifts it), then the conversion's faults."""
        rerun = (command_line("torchrun", "--nproc-per-node", "1", script, *args) if self.torchrun
                 else command_line("python", script, *args))
        if self.original_failure is not None:
            if self.cuda_rehearsed:  # what it stopped at has no CPU meaning (a CUDA stream, a CUDA-only kernel)
                raise AccelkitError(f"the original {script.name} itself failed on 1 process, its CUDA calls "
                                    f"rehearsed on the CPU ({self.original_failure}); the check compares the "
                                    "conversion with a working original",
                                    hint="--check runs both scripts on the CPU, and this needs a real GPU: try the "
                                         "conversion on GPUs (`accelkit launch`)")
            raise AccelkitError(f"the original {script.name} itself failed on 1 process ({self.original_failure}); "
                                "the check compares the conversion with a working original",
                                hint=f"fix the original first (`{rerun}` shows the error), then check again; the check "
                                     "runs it in a copy of the working directory, where paths above it (`../`) do not "
                                     "exist")
        if self.trained_nothing:
            raise AccelkitError(f"nothing was checked: the original {script.name} ran to its end without a training "
                                "step (no backward pass, no optimizer step)",
                                hint="--check proves a training script's conversion: pass the arguments that make "
                                     f"it train after SCRIPT (`accelkit convert --check {shlex.quote(str(script))} -- "
                                     "ARGS`)")
        if self.passed:
            return
        names = ", ".join(v.name for v in self.failed)
        fixes = [v.fix for v in self.failed if v.fix]
        if fixes and len(fixes) == len(self.failed):
            raise AccelkitError(f"the check of {script.name} could not run {names}: its runs stopped at {steps} "
                                "step(s) before reaching what it compares",
                                hint="raise the limit: `" + command_line("accelkit", "convert", "--check",
                                                                         *" ".join(fixes).split(), script,
                                                                         script_args=args) + "`")
        raise AccelkitError(f"the converted {script.name} failed {len(self.failed)} of {len(self.verdicts)} "
                            f"checks: {names}",
                            hint="the FAIL lines above give the evidence; `accelkit convert "
                                 f"{shlex.quote(str(script))}` prints what the conversion did")

    def format(self) -> str:
        lines = [f"  note  {REHEARSED_LINE}"] if self.cuda_rehearsed else []
        for verdict in self.verdicts:
            lines.append(f"  {verdict.status}  {verdict.name:<13} {verdict.summary}")
            lines += [f"{'':21}{e}" for e in verdict.evidence]
        return "\n".join(lines)


def check_script(script: Path, args: list[str], options: CheckOptions | None = None,
                 workdir: Path | None = None, converted_code: str | None = None,
                 converted_name: str | None = None) -> CheckOutcome:
    """Check `script`'s conversion (or `converted_code`, a conversion made or edited by hand, from the file
    `converted_name`) by running both, each in a sandbox: a copy of `workdir` (default: the current directory)."""
    from accelkit.convert.codemod import convert_source

    options = options or CheckOptions()
    if options.backend not in CHECK_BACKENDS:
        raise AccelkitError(f"--check rehearses {' or '.join(CHECK_BACKENDS)}, not {options.backend!r}",
                            hint="check under ddp or fsdp; run other backends with `accelkit launch --cpu --backend`")
    source = script.read_text(encoding="utf-8")
    result = convert_source(source, filename=script.name, directory=script.resolve().parent)
    if result.report.status == "already-accelerate":
        raise AccelkitError(f"{script.name} already uses Accelerate: --check compares a single-device script with "
                            "its conversion", hint="run `accelkit convert --check` on the single-device original")
    if result.report.status == "trainer":
        raise AccelkitError(f"{script.name}: nothing to check, nothing is converted: {result.report.advice}",
                            hint="--check compares a single-device script with its conversion")
    iteration_based = result.report.iteration_based
    code = result.code if converted_code is None else converted_code
    lines = (ConvertedLines.mapped(script.name, source, code) if converted_code is None
             else ConvertedLines.named(script.name, converted_name or script.name))
    tree = plan_sandbox(workdir or Path.cwd(), script, options.sandbox_limit)  # refuses before anything runs
    with Scratch(workdir or Path.cwd()) as scratch:
        # one sandbox per run, made just before it and removed right after: the runs never see each other's files
        box = tree.materialize(scratch.root / "sandbox-converted")
        converted = run(converted_spec(scratch, box, code, args, options.steps, options.processes,
                                       options.stall_seconds, options.timeout, options.backend), box.script.parent)
        box.remove()
        replay = converted_spec_probe_dir(scratch)
        box = tree.materialize(scratch.root / "sandbox-original")
        launcher_env = one_process_env() if needs_launcher(source) else None  # torchrun-style: 1-process torchrun
        original = run(original_spec(scratch, box, script, args, options.processes * options.steps,
                                     options.processes, replay, options.stall_seconds, options.timeout,
                                     launcher_env), box.script.parent)
        cuda_rehearsed = failed_for_cuda(original.status, original.stderr)
        if cuda_rehearsed:  # written for a GPU, and this machine has none: again, its CUDA calls on the CPU
            box.remove()
            box = tree.materialize(scratch.root / "sandbox-original-cuda")
            rehearsed = run(original_spec(scratch, box, script, args, options.processes * options.steps,
                                          options.processes, replay, options.stall_seconds, options.timeout,
                                          launcher_env and one_process_env(), rehearsal_env()), box.script.parent)
            # stopped by the same error again: CUDA was not what stopped it, and the first run says so truly
            cuda_rehearsed = rehearsed.status in (0, None) or _last_error(rehearsed) != _last_error(original)
            original = rehearsed if cuda_rehearsed else original
        box.remove()
        equivalence = None
        if converted.status == 0 and original.status == 0 and converted.records:
            # the original once more, at the conversion's global batch: the weights it reaches are the conversion's
            box = tree.materialize(scratch.root / "sandbox-equivalence")
            same = run(equivalence_spec(scratch, box, script, args, options.steps, options.processes,
                                        replay_order(converted.records), options.stall_seconds, options.timeout,
                                        launcher_env and one_process_env(),
                                        rehearsal_env() if cuda_rehearsed else None), box.script.parent)
            box.remove()
            failure = "" if same.status in (0, None) else f"exit status {same.status}: {_last_error(same)}"
            equivalence = Equivalence(same.records[0] if same.records else None, failure,
                                      compare_weights(converted_spec_probe_dir(scratch),
                                                      scratch.root / "probe-equivalence"))
    full_batch = any(f.kind == "batches" and f.action.startswith("full batch") for f in result.report.found)
    runs = Runs(original.records[0] if original.records else None, converted.records, options.processes,
                iteration_based, tuple(result.report.evaluation_loops), options.steps, full_batch,
                tuple(result.report.evaluation_every), equivalence)
    verdicts = [_ran(original, converted, options.processes, options.backend, launcher_env is not None,
                     cuda_rehearsed),
                *evaluate(runs),
                _no_hang(original, converted, script.name, lines)]
    problems = [p.format() for p in result.report.problems] if converted_code is None else []
    return CheckOutcome(script.name, verdicts, original, converted, problems, launcher_env is not None,
                        cuda_rehearsed)


def converted_spec_probe_dir(scratch: Scratch) -> Path:
    return scratch.root / "probe-converted"


def _ran(original: RunResult, converted: RunResult, world: int, backend: str = "ddp",
         torchrun: bool = False, cuda_rehearsed: bool = False) -> Verdict:
    name = "ran"
    one = "1 process under a 1-process torchrun environment" if torchrun else "1 process"
    one += ", CUDA rehearsed on CPU" if cuda_rehearsed else ""
    evidence = []
    if converted.status not in (0, None):
        evidence.append(f"converted, {world} processes: exit status {converted.status}: {_last_error(converted)}")
    if original.status not in (0, None):
        evidence.append(f"original, {one}: exit status {original.status}: {_last_error(original)}")
    if len(converted.records) < world and converted.status == 0:
        evidence.append(f"only {len(converted.records)} of {world} ranks reported")
    if evidence:
        return Verdict(name, FAIL, "a run failed", tuple(evidence))
    if converted.status is None or original.status is None:
        return Verdict(name, SKIP, "a run was stopped (see `no hang`)")
    if not _took_a_step(original):
        return Verdict(name, FAIL, "nothing was checked: the original ran to its end without a training step (no "
                                   "backward pass, no optimizer step)",
                       ("an empty script, one without a model and optimizer, or arguments that make it skip "
                        "training",))
    steps = max((len([s for s in r.steps if s.optimizer >= 0]) for r in converted.records), default=0)
    return Verdict(name, PASS, f"original on {one} ({original.seconds:.1f} s), converted on {world} CPU ranks "
                               f"({backend.upper()}, {steps} optimizer step(s), {converted.seconds:.1f} s)")


def _took_a_step(result: RunResult) -> bool:
    return any(r.steps or r.backward_passes for r in result.records)


def _no_hang(original: RunResult, converted: RunResult, script: str, lines: ConvertedLines) -> Verdict:
    name = "no hang"
    for label, result in (("converted", converted), ("original", original)):
        if result.stalled or result.timed_out:
            why = "made no progress" if result.stalled else "did not finish in time"
            shown = lines if label == "converted" else None
            evidence = tuple(f"rank {rank}: {where}" for rank, where in sorted(_stuck_at(result, shown).items()))
            return Verdict(name, FAIL, f"the {label} run {why}: stopped after {result.seconds:.0f} s", evidence)
    passes = {r.rank: r.backward_passes for r in converted.records}
    if len(set(passes.values())) > 1:
        counts = ", ".join(f"rank {rank}: {count}" for rank, count in sorted(passes.items()))
        return Verdict(name, FAIL, "the processes left training at different steps (backward passes: "
                                   f"{counts}): on GPUs the others wait for it in the next all-reduce forever",
                       ("a stop decision (break, return) made from a value each process computes from its own "
                        "batches; decide it together: accelerator.set_trigger() / accelerator.check_trigger()",))
    return Verdict(name, PASS, f"every process finished ({converted.seconds:.1f} s on the ranks)")


def _stuck_at(result: RunResult, lines: ConvertedLines | None = None) -> dict[int, str]:
    """Where each rank was, from the stack the supervisor took: the innermost line of the script, and what it was
    waiting in. `lines` shows the converted copy's lines as the original's (or under the user's converted file's
    name)."""
    from accelkit.ranks import is_library_file

    where = {}
    for stack in result.stacks:
        frames = list(reversed(stack.frames))  # innermost first
        mine = [f for f in frames if not is_library_file(f.file)]  # as the stall report tells them
        if not mine:
            where[stack.rank] = "no frame of the script on the stack"
            continue
        inner, top = frames[0], mine[0]
        at = (lines.where(Path(top.file).name, top.line, top.function) if lines is not None
              else f"{Path(top.file).name}:{top.line} in {top.function}")
        where[stack.rank] = at + ("" if inner is top else f" (waiting in {inner.function}, "
                                                          f"{Path(inner.file).name}:{inner.line})")
    for record in result.records:
        where.setdefault(record.rank, f"finished ({record.reason})")
    return where


ERROR_LINE = re.compile(r"(?:^|\]:?\s*)((?:[A-Za-z_][\w.]*)(?:Error|Exception|Interrupt|Exit)\b.*|Error: .*)$")


def _last_error(result: RunResult) -> str:
    """The last exception line of the run's stderr (rank prefixes such as `[rank1]: ` removed)."""
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    errors = [m.group(1) for m in map(ERROR_LINE.search, lines) if m and ":" in m.group(1)]
    if errors:
        return errors[-1][:300]
    return lines[-1][:300] if lines else "no output"


__all__ = ["FAIL", "PASS", "SKIP", "CheckOptions", "CheckOutcome", "check_script"]
