"""`convert_source`: single-device PyTorch script text in, Accelerate script text plus a report out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import libcst as cst
from libcst.codemod import CodemodContext
from libcst.codemod.visitors import AddImportsVisitor, RemoveImportsVisitor
from libcst.metadata import MetadataWrapper, ScopeProvider

from accelkit.convert.analysis import analyze
from accelkit.convert.context import Context
from accelkit.convert.edits import EditPlan, PlanApplier
from accelkit.convert.library import LazyAccelerator
from accelkit.convert.report import Report
from accelkit.convert.trainers import find_trainer
from accelkit.convert.transforms import TRANSFORMS
from accelkit.convert.verify import find_concerns
from accelkit.errors import AccelkitError

MIXED_PRECISION_CHOICES = ("no", "fp16", "bf16")
# imports that become unused once AMP and DataParallel code is gone (removed only when nothing else uses them)
MAYBE_UNUSED = [("torch.cuda.amp", "GradScaler"), ("torch.cuda.amp", "autocast"), ("torch.amp", "GradScaler"),
                ("torch.amp", "autocast"), ("torch", "autocast"), ("torch", "GradScaler"),
                ("torch.nn", "DataParallel"), ("torch.nn.parallel", "DataParallel"),
                ("torch.nn.parallel", "DistributedDataParallel"),
                ("torch.utils.data.distributed", "DistributedSampler"), ("torch.utils.data", "DistributedSampler"),
                ("torch.distributed", "init_process_group"), ("torch.distributed", "destroy_process_group")]
# the same names imported under a short alias (`... import DistributedDataParallel as DDP`, `import ... as dist`)
MAYBE_UNUSED_ALIASED = [("torch.nn.parallel", "DistributedDataParallel", "DDP"), ("torch.distributed", None, "dist")]


@dataclass(frozen=True)
class ConvertOptions:
    mixed_precision: str | None = None  # None: keep what the script did (AMP -> fp16/bf16, else the launch decides)
    grad_compression: str | None = None  # fp16 | bf16 | powersgd:rank=R,start=S: a DDP comm hook (issue 35)


@dataclass
class ConversionResult:
    code: str
    report: Report
    changed: bool


def convert_source(source: str, options: ConvertOptions | None = None, filename: str = "script.py",
                   directory: Path | None = None) -> ConversionResult:
    """Convert `source` (the text of `filename`); `directory`: the script's folder, where the conversion reads the
    script's own modules it imports (a training module already converted prepares the model itself)."""
    options = options or ConvertOptions()
    if options.mixed_precision not in (None, *MIXED_PRECISION_CHOICES):
        raise AccelkitError(f"unknown mixed precision {options.mixed_precision!r}",
                            hint=f"use one of: {', '.join(MIXED_PRECISION_CHOICES)}")
    try:  # Python's own parser names the line and column the user expects
        compile(source, filename, "exec", dont_inherit=True, flags=0x400)  # PyCF_ONLY_AST: parse, no bytecode
    except SyntaxError as exc:
        raise AccelkitError(f"{filename}:{exc.lineno}:{exc.offset}: syntax error, cannot convert: {exc.msg}",
                            hint="fix the script so that `python -m py_compile` accepts it") from None
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:
        raise AccelkitError(f"{filename}:{exc.raw_line}:{exc.raw_column + 1}: syntax error, cannot convert: "
                            f"{exc.message}", hint="fix the script so that `python -m py_compile` accepts it") from None
    ctx = Context(module, directory)
    facts = analyze(ctx)
    if facts.refusals:
        line, reason = facts.refusals[0]
        raise AccelkitError(f"{filename} already does distributed training: {reason} (line {line}); accelkit "
                            "convert converts single-device and torchrun-style (init_process_group + DDP) scripts",
                            hint="run it as it is, or start from a version launched by torchrun (one process per "
                                 "device, no spawn) and convert that")
    if facts.uses_accelerate:
        return ConversionResult(source, Report(status="already-accelerate"), False)
    trainer = find_trainer(ctx)
    if trainer is not None:  # the trainer owns the distributed part: changing the script would only break it
        return ConversionResult(source, Report(status="trainer", advice=trainer.advice(filename)), False)
    plan = EditPlan()
    for transform in TRANSFORMS:
        transform(ctx, facts, plan, options)
    if not plan.has_changes:  # a refusal with nothing else to change is still a refusal (an imported Trainer)
        return ConversionResult(source, Report(left_alone=plan.report.left_alone, status="unchanged",
                                               problems=plan.report.problems), False)
    dirty = {id(a) for node in plan.touched() for a in (node, *ctx.ancestors(node))}
    new_module = ctx.module.visit(PlanApplier(plan, dirty))
    if plan.library:
        new_module = new_module.visit(LazyAccelerator())
    new_module = _import_torch_if_unbound(_drop_unused_imports(new_module, source))
    code = new_module.code
    try:
        compile(code, filename, "exec")
    except SyntaxError as exc:  # a bug in a transform: never hand the user a broken file
        raise AccelkitError(f"internal error: the converted {filename} does not compile ({exc.msg}, line "
                            f"{exc.lineno})", hint="please report this with the script; nothing was written") from None
    for finding in find_concerns(code):  # what --check would catch by running it, caught before anything is written
        plan.report.problem(0, f"line {finding.line} of the converted script: {finding.what}", finding.todo)
    return ConversionResult(code, plan.report.sorted(), code != source)


def _import_torch_if_unbound(module: cst.Module) -> cst.Module:
    """The transforms write `torch.` code (a tensor for a reduced metric, a device move); a script that only imports
    from torch (`from torch import nn, optim`) binds no `torch`: the conversion imports it (it crashed on 2 ranks)."""
    wrapper = MetadataWrapper(module)
    unbound = any(access.node.value == "torch" and not access.referents
                  for scope in set(wrapper.resolve(ScopeProvider).values()) if scope is not None
                  for access in scope.accesses if isinstance(access.node, cst.Name))
    if not unbound:
        return module
    context = CodemodContext(wrapper=wrapper)
    AddImportsVisitor.add_needed_import(context, "torch")
    return wrapper.visit(AddImportsVisitor(context))


def _drop_unused_imports(module: cst.Module, source: str) -> cst.Module:
    candidates = [(m, n, None) for m, n in MAYBE_UNUSED if n in source]
    candidates += [(m, n, a) for m, n, a in MAYBE_UNUSED_ALIASED if f" as {a}" in source]
    if not candidates:
        return module
    wrapper = MetadataWrapper(module)
    context = CodemodContext(wrapper=wrapper)
    return wrapper.visit(RemoveImportsVisitor(context, candidates))
