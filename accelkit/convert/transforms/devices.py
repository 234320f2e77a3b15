"""Devices: device definitions become `accelerator.device`; models and loader batches stop being moved by hand
(prepare places them); `nn.DataParallel` and `torch.cuda.set_device` go away."""

from __future__ import annotations

import re

import libcst as cst

from accelkit.convert.analysis import Facts, assign_parts, classify, inside_class, strip_chain
from accelkit.convert.context import Context, accel, dotted
from accelkit.convert.plan import Plan

ACCEL_DEVICE_RE = re.compile(r"^(cuda|mps|xpu|npu|hpu)(:\d+)?$")
MOVE_METHODS = {"to", "cuda"}
WHY_DEVICE = "Accelerate gives each process its own device; `accelerator.device` is it (cpu, cuda:N, mps, ...)"


def apply(ctx: Context, facts: Facts, plan: Plan, options: object) -> None:
    _device_definitions(ctx, facts, plan)
    _set_device_calls(ctx, plan)
    _moves(ctx, facts, plan)
    _data_parallel(ctx, facts, plan)


def _string_value(node: cst.CSTNode) -> str | None:
    if isinstance(node, cst.SimpleString):
        return node.evaluated_value if isinstance(node.evaluated_value, str) else None
    return None


def is_device_expr(ctx: Context, expr: cst.BaseExpression) -> bool:
    """`"cuda"`, `torch.device("cuda" if ... else "cpu")`, `torch.accelerator.current_accelerator()`, ..."""
    value = _string_value(expr)
    if value is not None:
        return bool(ACCEL_DEVICE_RE.match(value))
    if isinstance(expr, cst.IfExp):
        return is_device_expr(ctx, expr.body) or is_device_expr(ctx, expr.orelse)
    if isinstance(expr, cst.Call):
        names = ctx.qnames(expr)
        if "torch.device" in names and expr.args:
            first = expr.args[0].value
            return _string_value(first) not in {"cpu", "meta"}
        if any(n.startswith("torch.accelerator.") or n == "torch.cuda.current_device" for n in names):
            return True
    if isinstance(expr, cst.Attribute):  # torch.accelerator.current_accelerator().type
        return is_device_expr(ctx, expr.value)
    return False


def _is_gpu_id(expr: cst.BaseExpression) -> bool:
    """An integer GPU id, or a name passing one along (`self.gpu_id = gpu_id`)."""
    if isinstance(expr, cst.Integer):
        return True
    if isinstance(expr, cst.IfExp):
        return _is_gpu_id(expr.body) or _is_gpu_id(expr.orelse)
    key = dotted(expr)
    return key is not None and bool(re.search(r"gpu|device|rank|cuda", key.rsplit(".", 1)[-1]))


def _device_definitions(ctx: Context, facts: Facts, plan: Plan) -> None:
    for small in ctx.of_type(cst.Assign, cst.AnnAssign):
        key, value = assign_parts(small)
        if key is None or value is None or inside_class(ctx, small, facts.model_classes):
            continue
        if is_device_expr(ctx, value) or (key in facts.device_names and _is_gpu_id(value)):
            plan.edit(small, lambda u: u.with_changes(value=accel("device")))
            plan.report.change(ctx.line(small), f"`{key} = {ctx.code(value)}` -> `{key} = accelerator.device`",
                               WHY_DEVICE)


def _set_device_calls(ctx: Context, plan: Plan) -> None:
    for call in ctx.of_type(cst.Call):
        if "torch.cuda.set_device" not in ctx.qnames(call):
            continue
        small = ctx.small_statement(call)
        if isinstance(small, cst.Expr) and small.value is call:
            plan.remove(small)
            plan.report.change(ctx.line(call), f"removed `{ctx.code(call)}`",
                               "the launcher pins each process to its device; Accelerate selects it")


def _is_dtype_move(ctx: Context, call: cst.Call) -> bool:
    if not call.args:
        return False
    first = ctx.code(call.args[0].value)
    return first.startswith(("torch.float", "torch.bfloat", "torch.half", "torch.int", "torch.double")) or \
        call.args[0].keyword is not None and call.args[0].keyword.value == "dtype"


def _batch_names(ctx: Context, facts: Facts, node: cst.CSTNode) -> set[str]:
    names: set[str] = set()
    ancestors = set(map(id, ctx.ancestors(node)))
    for loop, batch in facts.loader_loops:
        if id(loop) in ancestors:
            names |= batch
    return names


def _movable(ctx: Context, facts: Facts, call: cst.CSTNode) -> bool:
    """A `.to(...)`/`.cuda(...)` call on a model, or on a batch of a loader that prepare() will place."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Attribute)
            and call.func.attr.value in MOVE_METHODS) or _is_dtype_move(ctx, call):
        return False
    receiver = call.func.value
    if facts.kind(strip_chain(receiver)) == "model" or classify(ctx, receiver, facts.model_classes) == "model":
        return True
    return isinstance(receiver, cst.Name) and receiver.value in _batch_names(ctx, facts, call)


def _self_move(ctx: Context, facts: Facts, small: cst.BaseSmallStatement | None) -> bool:
    """`model.to(device)`, `model = model.cuda()`, `x, y = x.to(device), y.to(device)`: the whole statement goes."""
    if isinstance(small, cst.Expr):
        return _movable(ctx, facts, small.value)
    if not (isinstance(small, cst.Assign) and len(small.targets) == 1):
        return False
    target, value = small.targets[0].target, small.value
    if isinstance(value, cst.IfExp):  # `model = model.cuda() if cuda else model`
        key = dotted(target)
        return key is not None and all(
            dotted(branch) == key or (_movable(ctx, facts, branch) and dotted(branch.func.value) == key)  # type: ignore
            for branch in (value.body, value.orelse))
    pairs: list[tuple[cst.BaseExpression, cst.BaseExpression]]
    if isinstance(target, cst.Tuple) and isinstance(value, cst.Tuple) and len(target.elements) == len(value.elements):
        pairs = [(t.value, v.value) for t, v in zip(target.elements, value.elements, strict=True)]
    else:
        pairs = [(target, value)]
    return all(_movable(ctx, facts, v) and dotted(t) is not None and dotted(t) == dotted(v.func.value)  # type: ignore
               for t, v in pairs)


def _moves(ctx: Context, facts: Facts, plan: Plan) -> None:
    handled: set[int] = set()
    for call in list(ctx.of_type(cst.Call)):
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in MOVE_METHODS):
            continue
        if inside_class(ctx, call, facts.model_classes):
            continue
        small = ctx.small_statement(call)
        if small is not None and id(small) in handled:
            continue
        what = ctx.code(call)
        if _movable(ctx, facts, call):
            if _self_move(ctx, facts, small):
                handled.add(id(small))
                plan.remove(small)
                plan.report.change(ctx.line(call), f"removed `{ctx.code(small)}`",
                                   "accelerator.prepare() places models and loader batches on the right device")
            else:
                plan.edit(call, lambda u: u.func.value, uses_accelerator=False)  # type: ignore[attr-defined]
                plan.report.change(ctx.line(call), f"`{what}` -> `{ctx.code(call.func.value)}`",
                                   "accelerator.prepare() places models and loader batches on the right device")
            continue
        if call.func.attr.value == "cuda":
            plan.edit(call, lambda u: u.with_changes(func=u.func.with_changes(attr=cst.Name("to")),
                                                      args=[cst.Arg(accel("device"))]))
            plan.report.change(ctx.line(call), f"`{what}` -> `.to(accelerator.device)`", WHY_DEVICE)
        elif call.args and call.args[0].keyword is None and (
                isinstance(call.args[0].value, cst.Integer) or is_device_expr(ctx, call.args[0].value)):
            plan.edit(call, lambda u: u.with_changes(args=[u.args[0].with_changes(value=accel("device")),
                                                           *u.args[1:]]))
            plan.report.change(ctx.line(call), f"`{what}` -> `.to(accelerator.device)`", WHY_DEVICE)
    for call in ctx.of_type(cst.Call):
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "device" and is_device_expr(ctx, arg.value):
                plan.edit(arg, lambda u: u.with_changes(value=accel("device")))
                plan.report.change(ctx.line(arg), f"`device={ctx.code(arg.value)}` -> `device=accelerator.device`",
                                   WHY_DEVICE)


def _data_parallel(ctx: Context, facts: Facts, plan: Plan) -> None:
    why = "accelerator.prepare() wraps the model for the launched backend (DDP, FSDP, DeepSpeed)"
    for small, call in facts.wrappers:
        inner = call.args[0].value if call.args else None
        key = None
        if isinstance(small, cst.Assign) and len(small.targets) == 1:
            key = dotted(small.targets[0].target)
        if inner is not None and key is not None and dotted(inner) == key:
            plan.remove(small)
            plan.report.change(ctx.line(small), f"removed `{ctx.code(small)}`", why)
        elif inner is not None:
            plan.edit(call, lambda u: u.args[0].value, uses_accelerator=False)  # type: ignore[attr-defined]
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `{ctx.code(inner)}`", why)
