"""Create the one `accelerator = Accelerator(...)` every other edit refers to, and import it.

Placement: right after argument parsing when the script parses arguments (so `--help` stays instant and the mixed
precision can depend on the arguments); inside that function when the parsing happens in one (declared `global`
when module-level helpers also use it); otherwise at module level after the imports, before the first statement that
needs it.
"""

from __future__ import annotations

import builtins

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context, names_in
from accelkit.convert.edits import EditPlan
from accelkit.convert.library import is_library

IMPORT = "from accelerate import Accelerator\n"


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    if not plan.accelerator_uses:
        return
    if is_library(ctx):
        plan.library = True
        _insert_import(ctx, plan, ctx.module, len(ctx.module.body))
        plan.report.change(0, "no module-level Accelerator: this is a library file (no `__main__` code), so the "
                              "Accelerator is created where it is used (`self.accelerator = Accelerator()` in each "
                              "class's __init__, `accelerator = Accelerator()` in functions)",
                           "an Accelerator made at import time would pick devices and processes before the "
                           "importing script's own setup")
        return
    parse = facts.parse_args
    function = ctx.function(parse) if parse is not None else None
    if function is not None and _returns_value(ctx, function):
        # `def get_args(): ... return parser.parse_args()`: the Accelerator goes after the call of the helper
        parse = _first_call_of(ctx, function.name.value)
        function = ctx.function(parse) if parse is not None else None
    if function is not None and isinstance(function.body, cst.IndentedBlock):
        _keep_module_level_prints(ctx, plan)
        suite, anchor_index, first_use, needs_global = _in_function(ctx, plan, function, parse)
    else:
        suite, anchor_index, first_use, needs_global = _at_module_level(ctx, plan, parse)
    body = list(suite.body)  # type: ignore[attr-defined]
    mixed, anchor_index, note = _mixed_precision(ctx, facts, options, suite, body, anchor_index, first_use, function)
    handlers = _grad_compression_handler(plan, getattr(options, "grad_compression", None))
    args = ", ".join([*([f"mixed_precision={mixed}"] if mixed else []),
                      *(f"{k}={v}" for k, v in plan.accelerator_args.items()), *handlers])
    creation = cst.parse_statement(f"accelerator = Accelerator({args})\n")
    _insert_import(ctx, plan, suite, anchor_index)
    where: int
    if anchor_index < 0:
        plan.body_start[suite].append(creation)
        where = ctx.line(body[0]) if body else 1
    else:
        if _is_import(body[anchor_index]):  # a blank line between the imports and the first statement
            creation = creation.with_changes(leading_lines=[cst.EmptyLine()])
        plan.after[body[anchor_index]].append(creation)
        where = ctx.line(body[anchor_index])
    if needs_global:
        plan.body_start[suite].insert(0, cst.parse_statement("global accelerator\n"))
    scope = f"in `{function.name.value}()`" if function is not None and suite is function.body else "at module level"
    plan.report.change(where, f"added `accelerator = Accelerator({args})` {scope}" +
                       (" (declared global: helpers outside it use it)" if needs_global else ""),
                       "one Accelerator per process drives device placement, wrapping, mixed precision and saving; "
                       "the launcher (accelkit launch / accelerate launch) tells it how many processes there are")
    if note:
        plan.report.leave(where, *note)


def _keep_module_level_prints(ctx: Context, plan: EditPlan) -> None:
    """The Accelerator is made inside a function: a `print` (or a call of a helper that only prints) that runs at
    import time (module level, outside the `__main__` block) stays as it is, since `accelerator` does not exist yet
    there (a NameError on import)."""
    for node, gated in [*((call, False) for call in plan.prints), *((s, True) for s in plan.gated_output)]:
        top = ctx.top_statement_in(node, ctx.module)
        if top is None or not _executes(top) or ctx.main_guard(node) is not None:
            continue
        plan.edits.pop(node, None)
        plan.accelerator_uses[:] = [n for n in plan.accelerator_uses if n is not node]
        plan.report.changes[:] = [c for c in plan.report.changes if c.line != ctx.line(node) or not (
            c.what.endswith("main process only") if gated else c.what.startswith("`print(...)`"))]


def _grad_compression_handler(plan: EditPlan, spec_text: str | None) -> list[str]:
    """`kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=...)]` for `convert --grad-compression` (what
    accelkit's templates build from $ACCELKIT_GRAD_COMPRESSION; DDP only, Accelerate ignores it under FSDP)."""
    if not spec_text or spec_text == "none":
        return []
    from accelkit.compression.compression_spec import parse_env_value

    spec = parse_env_value(spec_text, "--grad-compression")
    hook = {"fp16": "FP16", "bf16": "BF16", "powersgd": "POWER_SGD"}[spec.method]
    state = f", comm_state_option={spec.powersgd_state_options()!r}" if spec.method == "powersgd" else ""
    for name in ("DDPCommunicationHookType", "DistributedDataParallelKwargs"):
        if name not in plan.imports:
            plan.imports.append(name)
    return [f"kwargs_handlers=[DistributedDataParallelKwargs(comm_hook=DDPCommunicationHookType.{hook}{state})]"]


def _returns_value(ctx: Context, function: cst.FunctionDef) -> bool:
    return any(r.value is not None and ctx.function(r) is function for r in ctx.of_type(cst.Return))


def _first_call_of(ctx: Context, name: str) -> cst.BaseStatement | None:
    for call in ctx.of_type(cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == name:
            return ctx.statement(call)
    return None


def _uses_in(ctx: Context, plan: EditPlan, suite: cst.CSTNode) -> list[int]:
    body = list(suite.body)  # type: ignore[attr-defined]
    index = {id(line): i for i, line in enumerate(body)}
    found = []
    for node in plan.accelerator_uses:
        top = ctx.top_statement_in(node, suite)  # type: ignore[arg-type]
        if top is not None:
            found.append(index[id(top)])
    return found


def _in_function(ctx: Context, plan: EditPlan, function: cst.FunctionDef, parse: cst.BaseStatement):
    suite = function.body
    body = list(suite.body)
    anchor = ctx.top_statement_in(parse, suite)
    anchor_index = body.index(anchor) if anchor is not None else -1
    uses = _uses_in(ctx, plan, suite)
    first_use = min(uses) if uses else len(body)
    if first_use <= anchor_index:
        anchor_index = -1
    needs_global = any(ctx.top_statement_in(node, suite) is None for node in plan.accelerator_uses)
    return suite, anchor_index, first_use, needs_global


def _executes(line: cst.CSTNode) -> bool:
    return not isinstance(line, (cst.FunctionDef, cst.ClassDef))


def _at_module_level(ctx: Context, plan: EditPlan, parse: cst.BaseStatement | None):
    module = ctx.module
    body = list(module.body)
    index = {id(line): i for i, line in enumerate(body)}
    uses = [i for i in _uses_in(ctx, plan, module) if _executes(body[i])]
    first_use = min(uses) if uses else len(body)
    if parse is not None:
        suite = ctx.suite_of(parse)
        top = ctx.top_statement_in(parse, module)
        if suite is not None and top is not None and index[id(top)] <= first_use:
            inner = list(suite.body)  # type: ignore[attr-defined]
            position = inner.index(parse)
            inner_uses = _uses_in(ctx, plan, suite) if suite is not module else uses
            if all(u > position for u in inner_uses) and (suite is module or index[id(top)] < first_use or
                                                          _only_after(ctx, plan, top, parse)):
                return suite, position, (min(inner_uses) if inner_uses else len(inner)), False
    imports = [i for i, line in enumerate(body) if i < first_use and _is_import(line)]
    return module, (max(imports) if imports else -1), first_use, False


def _only_after(ctx: Context, plan: EditPlan, top: cst.CSTNode, parse: cst.BaseStatement) -> bool:
    """Every use inside the module-level statement `top` sits in the block after `parse`."""
    suite = ctx.suite_of(parse)
    for node in plan.accelerator_uses:
        if ctx.top_statement_in(node, ctx.module) is top and ctx.top_statement_in(node, suite) is None:  # type: ignore
            return False
    return True


def _is_import(line: cst.CSTNode) -> bool:
    return isinstance(line, cst.SimpleStatementLine) and any(isinstance(s, (cst.Import, cst.ImportFrom))
                                                             for s in line.body)


def _insert_import(ctx: Context, plan: EditPlan, suite: cst.CSTNode, anchor_index: int) -> None:
    module = ctx.module
    body = list(module.body)
    limit = anchor_index if suite is module else len(body)
    imports = [i for i, line in enumerate(body) if _is_import(line) and i <= max(limit, -1)]
    if not imports and suite is not module:
        imports = [i for i, line in enumerate(body) if _is_import(line)]
    statement = cst.parse_statement(IMPORT if not plan.imports else
                                    f"from accelerate import {', '.join(['Accelerator', *plan.imports])}\n")
    if imports:
        plan.after[body[max(imports)]].insert(0, statement)
    else:
        plan.body_start[module].insert(0, statement)


def _mixed_precision(ctx: Context, facts: Facts, options: object, suite: cst.CSTNode, body: list, anchor_index: int,
                     first_use: int, function: cst.FunctionDef | None):
    """The `mixed_precision=` argument: the --mixed-precision option, else what the script's AMP code did."""
    chosen = getattr(options, "mixed_precision", None)
    if chosen is not None:
        return f'"{chosen}"', anchor_index, None
    if facts.amp_dtype is None:
        return None, anchor_index, None
    literal = f'"{facts.amp_dtype}"'
    enabled = facts.amp_enabled
    if enabled is None:
        return literal, anchor_index, None
    # keep the script's own switch (`GradScaler(enabled=use_amp)`) when its names exist where the Accelerator goes
    position = anchor_index
    module_names = _bound_names(list(ctx.module.body))
    params = {p.name.value for p in function.params.params} if function is not None else set()
    bound = [_bound_names([line]) for line in body]
    for name in sorted(n for n in names_in(enabled) if "." not in n):
        earlier = [i for i, names in enumerate(bound) if name in names and i < first_use]
        if earlier:
            position = max(position, max(earlier))
        elif name in params or hasattr(builtins, name) or (suite is not ctx.module and name in module_names):
            continue
        else:
            note = (f"the script's AMP switch `{ctx.code(enabled)}` is not available where the Accelerator is "
                    f"created; mixed precision is now always {facts.amp_dtype}",
                    "edit `Accelerator(mixed_precision=...)` or pass `accelkit convert --mixed-precision`")
            return literal, anchor_index, note
    return f'{literal} if {ctx.code(enabled)} else "no"', position, None


def _bound_names(lines: list) -> set[str]:
    """Names a list of statements binds (assignments, imports, defs)."""
    found: set[str] = set()
    for line in lines:
        if isinstance(line, (cst.FunctionDef, cst.ClassDef)):
            found.add(line.name.value)
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    found |= {n for n in names_in(target.target) if "." not in n}
            elif isinstance(small, cst.AnnAssign):
                found |= {n for n in names_in(small.target) if "." not in n}
            elif isinstance(small, (cst.Import, cst.ImportFrom)) and not isinstance(small.names, cst.ImportStar):
                for alias in small.names:
                    name = alias.asname.name if alias.asname else alias.name
                    found.add(ctx_code(name).split(".")[0])
    return found


def ctx_code(node: cst.CSTNode) -> str:
    return cst.Module([]).code_for_node(node)
