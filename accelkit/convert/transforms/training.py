"""The training step: `loss.backward()` -> `accelerator.backward(loss)`, gradient clipping through the accelerator,
and torch AMP (autocast + GradScaler) replaced by Accelerate's mixed precision."""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import AUTOCASTS, Facts
from accelkit.convert.context import Context, accel, accel_call, dotted
from accelkit.convert.edits import EditPlan

CLIPS = {
    "torch.nn.utils.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_norm_": "clip_grad_norm_",
    "torch.nn.utils.clip_grad_value_": "clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_value_": "clip_grad_value_",
}
WHY_SCALER = "Accelerate owns loss scaling under fp16 mixed precision (accelerator.backward, the prepared optimizer)"
SUM_NOTE = ("# a loss summed over the batch (reduction='sum'): DDP/FSDP average the gradients over the processes;",
            "# times the number of processes, the step is the original's on the global batch")
WHY_SUM = ("DDP/FSDP average gradients over the processes: a per-process sum averaged is 1/N of the sum over the "
           "global batch the original takes at N times the batch; scaled by N it is that sum again")


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    scalers = facts.of_kind("scaler")
    if scalers and _own_autocast_context(ctx):
        # nanoGPT: `ctx = nullcontext() if cpu else torch.amp.autocast(device_type, dtype=ptdtype)` with
        # `GradScaler(enabled=(dtype == 'float16'))`: the script picks bf16 or fp16 at run time (what the GPU
        # supports, config overrides). Its own autocast and GradScaler stay, and work per process under DDP (the
        # gradients are all-reduced before the scaler looks at them, so every process skips the same steps); a
        # hard-coded Accelerator(mixed_precision=...) would pick for it, and fail on a CPU.
        facts.amp_dtype, facts.amp_enabled = None, None
        plan.report.leave(0, "the script's own AMP (its autocast context object and GradScaler) is kept: it "
                             "chooses the precision at run time",
                          "nothing; or move to Accelerate's mixed precision (accelerator.autocast(), "
                          "Accelerator(mixed_precision=...)) by hand")
        _backward(ctx, plan, set())
        _clipping(ctx, plan)
        _closure_steps(ctx, facts, plan)
        return
    _backward(ctx, plan, scalers)
    _clipping(ctx, plan)
    _scaler(ctx, facts, plan, scalers)
    _autocast(ctx, plan)
    _closure_steps(ctx, facts, plan)


def _own_autocast_context(ctx: Context) -> bool:
    """An autocast made as an object outside a `with` (kept in a variable the script enters later)."""
    return any(ctx.qnames(call) & AUTOCASTS and not isinstance(ctx.parent(call), cst.WithItem)
               for call in ctx.of_type(cst.Call))


def _closure_steps(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    """`loss = optimizer.step(closure)`: Accelerate's optimizer wrapper returns None, so step the inner optimizer."""
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step" and call.args
                and facts.kind(func.value) == "optimizer"):
            continue
        small = ctx.small_statement(call)
        if isinstance(small, cst.Expr) and small.value is call:
            continue  # the result is not used: the prepared optimizer passes the closure through
        plan.edit(func, lambda u: u.with_changes(value=cst.Attribute(value=u.value, attr=cst.Name("optimizer"))),
                  uses_accelerator=False)
        name = ctx.code(func.value)
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `{name}.optimizer.step(...)`",
                           "the prepared optimizer's step(closure) returns None; the inner optimizer returns the "
                           "closure's loss (LBFGS-style optimizers do not use fp16 loss scaling anyway)")


def _is_scale_call(node: cst.BaseExpression, scalers: set[str]) -> bool:
    return (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "scale"
            and dotted(node.func.value) in scalers and len(node.args) == 1)


def _backward(ctx: Context, plan: EditPlan, scalers: set[str]) -> None:
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "backward"):
            continue
        if any(q.startswith("torch.autograd") for q in ctx.qnames(call)):
            continue
        scaled = _is_scale_call(func.value, scalers)
        received = func.value.args[0].value if scaled else func.value  # type: ignore[attr-defined]
        summed = _sum_reduced(ctx, received, call)

        def rewrite(u: cst.Call, scaled: bool = scaled, summed: bool = summed) -> cst.Call:
            loss = u.func.value  # type: ignore[attr-defined]
            if scaled:
                loss = loss.args[0].value
            if getattr(loss, "lpar", None):  # `(a + b).backward()` -> `accelerator.backward(a + b)`
                loss = loss.with_changes(lpar=[], rpar=[])
            if summed:
                if isinstance(loss, (cst.BinaryOperation, cst.BooleanOperation, cst.IfExp, cst.UnaryOperation)):
                    loss = loss.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
                loss = cst.BinaryOperation(left=loss, operator=cst.Multiply(), right=accel("num_processes"))
            extra = [a if a.keyword is not None else a.with_changes(keyword=cst.Name("gradient"),
                                                                     equal=cst.AssignEqual(
                                                                         whitespace_before=cst.SimpleWhitespace(""),
                                                                         whitespace_after=cst.SimpleWhitespace("")))
                     for a in u.args]
            first = cst.Arg(loss, comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")) if extra else
                            cst.MaybeSentinel.DEFAULT)
            return cst.Call(func=accel("backward"), args=[first, *extra])

        plan.edit(call, rewrite)
        loss_code = ctx.code(func.value.args[0].value) if scaled else ctx.code(func.value)  # type: ignore
        if summed:
            statement = ctx.statement(call)
            plan.edit(statement, lambda u: u.with_changes(leading_lines=[
                *u.leading_lines, *(cst.EmptyLine(comment=cst.Comment(note)) for note in SUM_NOTE)]),
                      uses_accelerator=False)
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.backward({loss_code} * "
                                               "accelerator.num_processes)`", WHY_SUM)
            continue
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.backward({loss_code})`",
                           "accelerator.backward applies loss scaling, gradient accumulation and DeepSpeed's engine")


def _reduction_is_sum(call: cst.Call) -> bool:
    return any(a.keyword is not None and a.keyword.value == "reduction" and isinstance(a.value, cst.SimpleString)
               and a.value.evaluated_value == "sum" for a in call.args)


def _sum_reduced(ctx: Context, loss: cst.BaseExpression, at: cst.CSTNode) -> bool:
    """The backpropagated `loss` is a sum over the batch: it calls a loss asked for with `reduction="sum"` (a
    functional loss, an `nn.*Loss(reduction="sum")` object held in a variable, or a function of the script that
    returns such sums), directly or through the assignments of the name it is, and divides nothing (a sum divided
    by the batch size is a mean again)."""
    function = ctx.function(at)
    scope = function.body if function is not None else ctx.module
    if isinstance(loss, cst.Name):
        values = [node.value for node in ctx.descendants(scope)
                  if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) and node.value is not None
                  and loss.value in _targets(node)]
        if not values:
            return False
        return all(_sums(ctx, value) for value in values)
    return _sums(ctx, loss)


def _targets(node: cst.CSTNode) -> set[str]:
    if isinstance(node, cst.Assign):
        return {ctx_name for t in node.targets if (ctx_name := dotted(t.target))}
    return {name} if (name := dotted(node.target)) else set()  # type: ignore[attr-defined]


def _sums(ctx: Context, expression: cst.BaseExpression) -> bool:
    nodes = [expression, *ctx.descendants(expression)]
    if any(isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
           for n in nodes):
        return False
    summing = _summing_losses(ctx)
    for node in nodes:
        if not isinstance(node, cst.Call):
            continue
        if _reduction_is_sum(node) or dotted(node.func) in summing:
            return True
    return False


def _summing_losses(ctx: Context) -> set[str]:
    """Names holding a loss that sums: `criterion = nn.MSELoss(reduction="sum")`, `self.loss_fn = ...`, and the
    script's own functions whose every loss call asks for `reduction="sum"` (`def loss_function(...)`)."""
    found: set[str] = set()
    for node in ctx.of_type(cst.Assign):
        value = node.value
        if isinstance(value, cst.Call) and _reduction_is_sum(value) and \
                any(q.rsplit(".", 1)[-1].endswith("Loss") for q in ctx.qnames(value)):
            found |= _targets(node)
    for function in ctx.of_type(cst.FunctionDef):
        calls = [c for c in ctx.descendants(function.body) if isinstance(c, cst.Call)]
        reductions = [c for c in calls if any(a.keyword is not None and a.keyword.value == "reduction"
                                              for a in c.args)]
        returns = [r for r in ctx.descendants(function.body) if isinstance(r, cst.Return) and r.value is not None]
        if reductions and all(_reduction_is_sum(c) for c in reductions) and returns and not any(
                isinstance(n, cst.BinaryOperation) and isinstance(n.operator, (cst.Divide, cst.FloorDivide))
                for r in returns for n in ctx.descendants(r)):
            found.add(function.name.value)
    return found


def _clipping(ctx: Context, plan: EditPlan) -> None:
    for call in ctx.of_type(cst.Call):
        method = next((CLIPS[q] for q in ctx.qnames(call) if q in CLIPS), None)
        if method is None:
            continue
        plan.edit(call, lambda u, m=method: u.with_changes(func=accel(m)))
        plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}` -> `accelerator.{method}`",
                           "it unscales fp16 gradients first and clips sharded (FSDP/DeepSpeed) parameters correctly")


def _scaler(ctx: Context, facts: Facts, plan: EditPlan, scalers: set[str]) -> None:
    if not scalers:
        return
    for item in facts.created:
        if item.kind == "scaler" and item.small is not None and not item.returned:
            plan.remove(item.small)
            plan.report.change(ctx.line(item.small), f"removed `{ctx.code(item.small)}`", WHY_SCALER)
    handled: set[int] = set()
    for node in ctx.of_type(cst.Call):
        func = node.func
        if not (isinstance(func, cst.Attribute) and dotted(func.value) in scalers):
            continue
        handled.add(id(func))
        method = func.attr.value
        small = ctx.small_statement(node)
        standalone = isinstance(small, cst.Expr) and small.value is node
        if method == "scale":
            if not _is_backward_receiver(ctx, node):
                plan.edit(node, lambda u: u.args[0].value, uses_accelerator=False)  # type: ignore[attr-defined]
                plan.report.change(ctx.line(node), f"`{ctx.code(node)}` -> `{ctx.code(node.args[0].value)}`",
                                   WHY_SCALER)
        elif method == "step" and node.args:
            optimizer = node.args[0].value
            plan.edit(node, lambda u: cst.Call(func=cst.Attribute(value=u.args[0].value, attr=cst.Name("step")),
                                               args=[a.with_changes(comma=cst.MaybeSentinel.DEFAULT)
                                                     for a in u.args[1:]]),
                      uses_accelerator=False)
            plan.report.change(ctx.line(node), f"`{ctx.code(node)}` -> `{ctx.code(optimizer)}.step()`", WHY_SCALER)
        elif method in {"update", "unscale_"} and standalone:
            plan.remove(small)
            why = WHY_SCALER if method == "update" else \
                "accelerator.clip_grad_norm_ unscales the gradients itself before clipping"
            plan.report.change(ctx.line(node), f"removed `{ctx.code(node)}`", why)
        else:
            handled.discard(id(func))
    # anything else done with the scaler (state_dict for checkpoints, get_scale, ...) goes to Accelerate's scaler
    for attr in ctx.of_type(cst.Attribute):
        if id(attr) in handled or dotted(attr.value) not in scalers:
            continue
        plan.edit(attr.value, lambda u: accel("scaler"))
        plan.report.leave(ctx.line(attr), f"`{ctx.code(attr)}` now uses `accelerator.scaler`, which is None unless "
                                          "the run uses fp16 mixed precision",
                          "guard it with `if accelerator.scaler is not None`, or checkpoint with "
                          "accelerator.save_state()/load_state(), which include the scaler")


def _is_backward_receiver(ctx: Context, node: cst.Call) -> bool:
    parent = ctx.parent(node)
    return isinstance(parent, cst.Attribute) and parent.attr.value == "backward"


def _autocast(ctx: Context, plan: EditPlan) -> None:
    for item in ctx.of_type(cst.WithItem):
        call = item.item
        if not (isinstance(call, cst.Call) and ctx.qnames(call) & AUTOCASTS):
            continue
        plan.edit(call, lambda u: accel_call("autocast"))
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.autocast()`",
                           "Accelerate enables autocast from its mixed-precision setting (--mixed-precision)")
