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

        def rewrite(u: cst.Call, scaled: bool = scaled) -> cst.Call:
            loss = u.func.value  # type: ignore[attr-defined]
            if scaled:
                loss = loss.args[0].value
            if getattr(loss, "lpar", None):  # `(a + b).backward()` -> `accelerator.backward(a + b)`
                loss = loss.with_changes(lpar=[], rpar=[])
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
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.backward({loss_code})`",
                           "accelerator.backward applies loss scaling, gradient accumulation and DeepSpeed's engine")


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
