"""Output and wrapped-model access: `torch.save` -> main-process `accelerator.save` after `wait_for_everyone()`,
`print` -> `accelerator.print`, and model attributes that a DDP/FSDP wrapper hides -> `unwrap_model(model)`."""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts, inside_class
from accelkit.convert.context import Context, accel, accel_call, dotted
from accelkit.convert.plan import Plan

# nn.Module API that works the same on the wrapper DDP/FSDP returns (everything else needs the unwrapped model)
WRAPPER_SAFE = {
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "train", "eval", "zero_grad", "requires_grad_", "forward", "training", "apply", "to", "cuda",
    "cpu", "float", "half", "double", "bfloat16", "type", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook",
}


def apply(ctx: Context, facts: Facts, plan: Plan, options: object) -> None:
    _saves(ctx, plan)
    _prints(ctx, plan)
    _unwrap(ctx, facts, plan)


def _saves(ctx: Context, plan: Plan) -> None:
    for call in ctx.of_type(cst.Call):
        if "torch.save" not in ctx.qnames(call):
            continue
        plan.edit(call, lambda u: u.with_changes(func=accel("save")))
        statement = ctx.statement(call)
        if statement is not None:
            plan.insert_before(statement, cst.SimpleStatementLine([cst.Expr(accel_call("wait_for_everyone"))]))
        plan.report.change(ctx.line(call), "`torch.save(...)` -> `accelerator.wait_for_everyone()` + "
                                           "`accelerator.save(...)`",
                           "every process must finish its step before one process (the main one) writes the file")


def _prints(ctx: Context, plan: Plan) -> None:
    lines: list[int] = []
    for call in ctx.of_type(cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == "print" and "builtins.print" in ctx.qnames(call):
            plan.edit(call, lambda u: u.with_changes(func=accel("print")))
            lines.append(ctx.line(call))
    if lines:
        listed = ", ".join(map(str, lines[:12])) + (", ..." if len(lines) > 12 else "")
        plural = "s" if len(lines) > 1 else ""
        plan.report.change(lines[0], f"`print(...)` -> `accelerator.print(...)` (line{plural} {listed})",
                           "only the main process prints, so N processes do not print everything N times")


def _unwrap(ctx: Context, facts: Facts, plan: Plan) -> None:
    models = facts.of_kind("model")
    for attr in ctx.of_type(cst.Attribute):
        key = dotted(attr.value)
        name = attr.attr.value
        if key not in models or name in WRAPPER_SAFE or inside_class(ctx, attr, facts.model_classes):
            continue
        if name == "module":  # `model.module` was the DataParallel way to reach the inner model
            plan.edit(attr, lambda u: accel_call("unwrap_model", u.value))
            plan.report.change(ctx.line(attr), f"`{ctx.code(attr)}` -> `accelerator.unwrap_model({key})`",
                               "the wrapper depends on the launch; unwrap_model returns the inner model in every case")
            continue
        plan.edit(attr, lambda u: u.with_changes(value=accel_call("unwrap_model", u.value)))
        why = (f"`.{name}` belongs to the model class; a DDP/FSDP wrapper does not have it"
               if name not in {"state_dict", "load_state_dict"} else
               "the wrapper's state_dict keys carry a `module.` prefix; the inner model's load anywhere")
        plan.report.change(ctx.line(attr), f"`{ctx.code(attr)}` -> `accelerator.unwrap_model({key}).{name}`", why)
