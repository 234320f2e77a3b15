"""Stop decisions made from per-process values become collective: `if loss.item() < eps: break` inside a training
loop becomes Accelerate's trigger pattern, so every process leaves the loop at the same step.

On N processes each rank sees its own batches, so its loss (and anything computed from it) differs: a rank that
breaks out while the others go on leaves them waiting in the next gradient all-reduce forever. The rewrite:

    if loss.item() < eps:            if loss.item() < eps:
        print("converged")    ->         print("converged")
        break                            accelerator.set_trigger()
                                     if accelerator.check_trigger():
                                         break

`check_trigger()` is true on every process as soon as one of them set the trigger.
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts, bindings, environment_call, environments
from accelkit.convert.context import Context, dotted
from accelkit.convert.edits import EditPlan
from accelkit.convert.flow import Flow

EXITS = (cst.Break, cst.Continue, cst.Return)


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    flow = Flow(ctx, facts)
    loops = [loop for loop in ctx.of_type(cst.For, cst.While) if flow.trains(loop)]
    seen: set[int] = set()
    for loop in loops:
        tainted = _per_process_values(ctx, facts, flow, loop)
        if isinstance(loop, cst.While) and _names(ctx, loop.test) & tainted:
            plan.report.problem(ctx.line(loop), f"the loop at line {ctx.line(loop)} runs while `{ctx.code(loop.test)}`"
                                                ", a value each process computes from its own batches: processes "
                                                "would stop at different steps and hang",
                                "loop with `while True:` and decide the stop with accelerator.set_trigger() / "
                                "accelerator.check_trigger()")
        for node in ctx.descendants(loop.body):
            if not isinstance(node, cst.If) or id(node) in seen or flow.innermost_loop(node) is None:
                continue
            exit_ = _exit_of(node)
            if exit_ is None or not (_names(ctx, node.test) & tainted):
                continue
            if not isinstance(exit_, cst.Return) and not flow.trains(flow.innermost_loop(node)):
                continue  # it leaves a loop that does not train (an episode ending on its own `done`): per process
            seen.add(id(node))
            _collective(ctx, plan, node, exit_)


def _per_process_values(ctx: Context, facts: Facts, flow: Flow, loop: cst.CSTNode) -> set[str]:
    """Names whose value depends on the process's own data: losses, model outputs, batches, and what is computed
    from them (or assigned under a condition on them)."""
    function = ctx.function(loop)
    scope = function if function is not None else ctx.module
    models = facts.of_kind("model")
    tainted = set()
    for call in flow.backward_calls:
        if ctx.contains(scope, call):
            target = call.func.value  # type: ignore[attr-defined]
            tainted |= _names(ctx, target)
    for _, batch in facts.loader_loops:
        tainted |= batch
    if isinstance(loop, cst.For) and not _counts(ctx, loop):
        target: cst.CSTNode = loop.target
        if isinstance(loop.iter, cst.Call) and ctx.code(loop.iter.func) == "enumerate" and \
                isinstance(target, cst.Tuple) and len(target.elements) == 2:
            target = target.elements[1]  # `step` of `for step, batch in enumerate(loader)` counts alike everywhere
        tainted |= {n.value for n in ctx.descendants(target) if type(n) is cst.Name}
    # what each assignment reads, runs and is guarded by, read once: the propagation below repeats over them
    envs = environments(ctx, facts.model_classes)  # each process plays its own episodes: rewards are its own
    assigns = []
    for node in ctx.descendants(scope):
        if not isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)) or node.value is None:
            continue
        runs_model = any(isinstance(c, cst.Call) and dotted(c.func) in models for c in ctx.descendants(node.value)) \
            or environment_call(ctx, node.value, envs, ("step", "reset")) is not None
        guards = [_names(ctx, a.test) for a in ctx.ancestors(node) if isinstance(a, cst.If)]
        assigns.append((node, runs_model, guards, _names(ctx, node.value)))
    # `rewards.append(reward)`: a container filled with per-process values holds them too
    fills = [(dotted(c.func.value), _names(ctx, c)) for c in ctx.descendants(scope)  # type: ignore[attr-defined]
             if type(c) is cst.Call and isinstance(c.func, cst.Attribute) and  # type: ignore[attr-defined]
             c.func.attr.value in {"append", "extend", "insert", "add", "update"}]  # type: ignore[attr-defined]
    for _ in range(4):
        for owner, reads in fills:
            if owner and reads & tainted:
                tainted.add(owner)
        for node, runs_model, guards, reads in assigns:
            if runs_model or reads & tainted or any(guard & tainted for guard in guards):
                if isinstance(node, cst.AugAssign):
                    key = dotted(node.target)
                    if key:
                        tainted.add(key)
                else:
                    tainted |= {k for k, _, _ in bindings(node)}
    return tainted


def _counts(ctx: Context, loop: cst.For) -> bool:
    """`for it in range(...)`: the loop variable is a counter, the same on every process."""
    return isinstance(loop.iter, cst.Call) and ctx.code(loop.iter.func) in {"range", "trange"}


def _names(ctx: Context, node: cst.CSTNode) -> set[str]:
    """Variables `node` reads, dotted (`self.loss`, `loss`): `self` alone in `self.loss` is not one of them."""
    found = set()
    for n in ctx.descendants(node):
        parent = ctx.parent(n)
        if type(n) is cst.Attribute and dotted(n):  # type: ignore[arg-type]
            found.add(dotted(n))  # type: ignore[arg-type]
        elif type(n) is cst.Name and not (isinstance(parent, cst.Attribute) and parent.attr is n) and \
                n.value not in {"self", "cls"}:  # type: ignore[attr-defined]
            found.add(n.value)  # type: ignore[attr-defined]
    return found


def _exit_of(node: cst.If) -> cst.BaseSmallStatement | None:
    """The break/continue/return that ends the `if` body (the `else`, if any, must not exit)."""
    body = node.body
    statements = list(body.body)
    if not statements:
        return None
    last = statements[-1]
    small = last if isinstance(last, EXITS) else \
        last.body[-1] if isinstance(last, cst.SimpleStatementLine) and last.body else None
    if not isinstance(small, EXITS):
        return None
    if node.orelse is not None:
        return None
    return small


def _collective(ctx: Context, plan: EditPlan, node: cst.If, exit_: cst.BaseSmallStatement) -> None:
    plan.edit(exit_, lambda u: cst.Expr(cst.parse_expression("accelerator.set_trigger()")))
    check = cst.If(test=cst.parse_expression("accelerator.check_trigger()"),
                   body=cst.IndentedBlock(body=[cst.SimpleStatementLine([exit_.deep_clone()])]))
    plan.insert_after(node, check)
    kind = type(exit_).__name__.lower()
    plan.report.change(ctx.line(node), f"`if {ctx.code(node.test)}: ... {kind}` -> set a trigger, then "
                                       f"`if accelerator.check_trigger(): {kind}`",
                       "the condition depends on each process's own batches: decided alone, one process would "
                       f"{kind} while the others wait for it in the next all-reduce (a hang); check_trigger() "
                       "makes every process stop together")
