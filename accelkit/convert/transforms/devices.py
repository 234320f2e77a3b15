"""Devices: device definitions become `accelerator.device`; models and loader batches stop being moved by hand
(prepare places them); `nn.DataParallel` and `torch.cuda.set_device` go away."""

from __future__ import annotations

import re

import libcst as cst

from accelkit.convert.analysis import Facts, assign_parts, bindings, classify, inside_class, strip_chain
from accelkit.convert.context import Context, accel, dotted
from accelkit.convert.edits import EditPlan

ACCEL_DEVICE_RE = re.compile(r"^(cuda|mps|xpu|npu|hpu)(:\d+)?$")
MOVE_METHODS = {"to", "cuda"}
WHY_DEVICE = "Accelerate gives each process its own device; `accelerator.device` is it (cpu, cuda:N, mps, ...)"


AVAILABILITY = re.compile(r"^torch\.(cuda|backends\.mps|accelerator|xpu|mps)\.is_available$")
FACTORIES = {"torch.randn", "torch.rand", "torch.randint", "torch.zeros", "torch.ones", "torch.full", "torch.empty",
             "torch.arange", "torch.linspace", "torch.eye", "torch.tensor", "torch.as_tensor", "torch.from_numpy",
             "torch.Tensor", "torch.FloatTensor", "torch.LongTensor", "torch.stack", "torch.cat"}
LOSS_CALL = re.compile(r"(loss|criterion|^F\.|functional\.)", re.I)


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    _device_definitions(ctx, facts, plan)
    _set_device_calls(ctx, plan)
    _moves(ctx, facts, plan)
    _data_parallel(ctx, facts, plan)
    _inputs_follow_the_device(ctx, facts, plan)
    _numpy_from_cpu(ctx, plan)
    _device_string_comparisons(ctx, facts, plan)
    _tensors_made_in_forward(ctx, facts, plan)
    _gpu_asserts(ctx, plan)


def _gpu_asserts(ctx: Context, plan: EditPlan) -> None:
    """`assert torch.cuda.is_available()`: the launch now chooses the device (a CPU rehearsal, `--cpu`, another
    accelerator); kept, it stops the converted script before training wherever there is no CUDA."""
    for small in ctx.of_type(cst.Assert):
        if isinstance(small.test, cst.Call) and ctx.qnames(small.test) & {"torch.cuda.is_available"} and \
                isinstance(ctx.parent(small), cst.SimpleStatementLine):
            plan.remove(small)
            plan.report.change(ctx.line(small), f"removed `{ctx.code(small)}`",
                               "the launch chooses the device (accelerator.device); the assert would stop the "
                               "script on a CPU launch (`accelkit launch --cpu`, `--check`)")


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
    if isinstance(expr, cst.FormattedString) and expr.parts and isinstance(expr.parts[0], cst.FormattedStringText):
        return bool(re.match(r"^(cuda|mps|xpu|npu|hpu):", expr.parts[0].value))  # f"cuda:{local_rank}"
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


def _is_string(expr: cst.BaseExpression) -> bool:
    """A string literal, an f-string, or a choice between them (`"cuda" if ok else "cpu"`)."""
    if isinstance(expr, cst.IfExp):
        return _is_string(expr.body) and _is_string(expr.orelse)
    return isinstance(expr, (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString))


def _is_gpu_id(expr: cst.BaseExpression) -> bool:
    """An integer GPU id, or a name passing one along (`self.gpu_id = gpu_id`)."""
    if isinstance(expr, cst.Integer):
        return True
    if isinstance(expr, cst.IfExp):
        return _is_gpu_id(expr.body) or _is_gpu_id(expr.orelse)
    key = dotted(expr)
    return key is not None and bool(re.search(r"gpu|device|rank|cuda", key.rsplit(".", 1)[-1]))


def _is_cpu(ctx: Context, expr: cst.BaseExpression) -> bool:
    if _string_value(expr) == "cpu":
        return True
    return isinstance(expr, cst.Call) and "torch.device" in ctx.qnames(expr) and bool(expr.args) and \
        _string_value(expr.args[0].value) == "cpu"


def _device_definitions(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    definitions = []
    for small in ctx.of_type(cst.Assign, cst.AnnAssign):
        key, value = assign_parts(small)
        if key is None or value is None or inside_class(ctx, small, facts.model_classes):
            continue
        definitions.append((small, key, value))
    # a name the script moves tensors to, and that is an accelerator in some branch: every branch is the device
    accelerated = {key for _, key, value in definitions if is_device_expr(ctx, value)}
    for small, key, value in definitions:
        explicit_cpu = _is_cpu(ctx, value) and key in facts.device_names
        if not (is_device_expr(ctx, value) or (key in facts.device_names and _is_gpu_id(value)) or explicit_cpu):
            continue
        if key.rsplit(".", 1)[-1].endswith("type"):  # `device_type = "cuda" if ... else "cpu"`: a string
            plan.edit(small, lambda u: u.with_changes(value=cst.Attribute(value=accel("device"),
                                                                          attr=cst.Name("type"))))
            plan.report.change(ctx.line(small), f"`{key} = {ctx.code(value)}` -> `{key} = accelerator.device.type`",
                               WHY_DEVICE)
            continue
        if _is_string(value):
            # a string stays a string: config overrides (nanoGPT's configurator asserts the type), `"cuda" in
            # device`, `device == "cuda"` and `torch.device(device)` keep working. "cuda" (no index) names this
            # process's GPU, since the Accelerator sets the current device; "cuda:{rank}" becomes "cuda:N".
            indexed = ":" in ctx.code(value)
            new_value = cst.Call(func=cst.Name("str"), args=[cst.Arg(accel("device"))]) if indexed else \
                cst.Attribute(value=accel("device"), attr=cst.Name("type"))
            plan.edit(small, lambda u, new_value=new_value: u.with_changes(value=new_value))
            new_text = "str(accelerator.device)" if indexed else "accelerator.device.type"
            plan.report.change(ctx.line(small), f"`{key} = {ctx.code(value)}` -> `{key} = {new_text}`",
                               WHY_DEVICE + "; the name stays a string, as the script (and its config overrides) "
                                            "expect")
            continue
        plan.edit(small, lambda u: u.with_changes(value=accel("device")))
        facts.accelerator_devices.add(key)
        plan.report.change(ctx.line(small), f"`{key} = {ctx.code(value)}` -> `{key} = accelerator.device`",
                           WHY_DEVICE)
        flag = _device_flag(ctx, facts, small, value)
        if flag is not None and "cpu" not in plan.accelerator_args:
            plan.accelerator_args["cpu"] = flag
            plan.report.change(ctx.line(small), f"the script's device switch is kept: `Accelerator(cpu={flag})`",
                               "the script chose the CPU on request; Accelerate's `cpu=True` does the same on every "
                               "process")
        elif explicit_cpu and key not in accelerated:
            plan.report.leave(ctx.line(small), f"the script sets `{key} = {ctx.code(value)}` explicitly; it is now "
                                               "`accelerator.device`, which the launch chooses",
                              "launch with `--cpu` (accelkit launch --cpu / accelerate launch --cpu) to keep "
                              "training on the CPU, or pass `cpu=True` to Accelerator(...)")


def _device_flag(ctx: Context, facts: Facts, small: cst.CSTNode, value: cst.BaseExpression) -> str | None:
    """`Accelerator(cpu=...)` for a device chosen by a command-line flag: `torch.device("cuda" if use_cuda else
    "cpu")` with `use_cuda = not args.no_cuda and torch.cuda.is_available()` gives `cpu=args.no_cuda`."""
    tests: list[cst.BaseExpression] = []
    if isinstance(value, cst.Call) and value.args:
        value = value.args[0].value
    if isinstance(value, cst.IfExp):
        tests.append(value.test)
    tests += [a.test for a in ctx.ancestors(small) if isinstance(a, (cst.If,))]
    args_name = _parsed_args_name(facts)
    for test in tests:
        negated = False
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            test, negated = test.expression, True
        expr = _resolve(ctx, test)
        terms = [t for t in _conjuncts(expr) if not (isinstance(t, cst.Call) and
                                                     any(AVAILABILITY.match(q) for q in ctx.qnames(t)))]
        if len(terms) != 1 or args_name is None:
            continue
        term = terms[0]
        inner = term.expression if isinstance(term, cst.UnaryOperation) and isinstance(term.operator, cst.Not) \
            else None
        flag = inner if inner is not None else term
        if not (isinstance(flag, cst.Attribute) and isinstance(flag.value, cst.Name) and flag.value.value ==
                args_name):
            continue
        uses_accelerator = (inner is not None) != negated  # `not args.no_cuda` selects the accelerator
        return ctx.code(flag) if uses_accelerator else f"not {ctx.code(flag)}"
    return None


def _parsed_args_name(facts: Facts) -> str | None:
    statement = facts.parse_args
    if isinstance(statement, cst.SimpleStatementLine):
        for small in statement.body:
            key, _ = assign_parts(small)
            if key:
                return key
    return None


def _resolve(ctx: Context, expr: cst.BaseExpression) -> cst.BaseExpression:
    """A name bound once by an assignment (`use_cuda = ...`) stands for its value."""
    if not isinstance(expr, cst.Name):
        return expr
    found = [v for s in ctx.of_type(cst.Assign) for k, v in [assign_parts(s)] if k == expr.value]
    return found[0] if len(found) == 1 and found[0] is not None else expr


def _conjuncts(expr: cst.BaseExpression) -> list[cst.BaseExpression]:
    if isinstance(expr, cst.BooleanOperation) and isinstance(expr.operator, cst.And):
        return [*_conjuncts(expr.left), *_conjuncts(expr.right)]
    return [expr]


def _numpy_from_cpu(ctx: Context, plan: EditPlan) -> None:
    """`t.numpy()` fails on a GPU tensor: `t.cpu().numpy()` works on every device."""
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "numpy" and not call.args):
            continue
        receiver = func.value
        if isinstance(receiver, cst.Call) and isinstance(receiver.func, cst.Attribute) and \
                receiver.func.attr.value in {"cpu", "to"}:
            continue
        if isinstance(receiver, cst.Name) and receiver.value in {"np", "numpy"}:
            continue
        plan.edit(func, lambda u: u.with_changes(value=cst.Call(func=cst.Attribute(value=u.value,
                                                                                      attr=cst.Name("cpu")))),
                  uses_accelerator=False)
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `{ctx.code(receiver)}.cpu().numpy()`",
                           "on a GPU the tensor lives on the device; .numpy() needs it on the CPU first")


def _inputs_follow_the_device(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    """Tensors the script makes itself (not loader batches) and feeds to a model or a loss: moved to
    `accelerator.device` where they are made, unless the script already moves them."""
    models = facts.of_kind("model")
    done: set[int] = set()
    for call in ctx.of_type(cst.Call):
        is_model = dotted(call.func) in models
        is_loss = not is_model and bool(LOSS_CALL.search(ctx.code(call.func)))
        if not (is_model or is_loss) or inside_class(ctx, call, facts.model_classes):
            continue
        for arg in call.args:
            if isinstance(arg.value, cst.Name):
                _move_where_made(ctx, facts, plan, call, arg.value.value, done)
            elif _unplaced_factory(ctx, arg.value):
                _move(ctx, plan, arg.value, done)
        if is_model:  # `((model(x) - noise) ** 2).mean()`: what is combined with the output is an input too
            statement = ctx.small_statement(call)
            for name in {n.value for n in ctx.descendants(statement) if type(n) is cst.Name} if statement else ():
                _move_where_made(ctx, facts, plan, call, name, done)


def _unplaced_factory(ctx: Context, expr: cst.BaseExpression) -> bool:
    if not isinstance(expr, cst.Call) or not ctx.qnames(expr) & FACTORIES:
        return False
    return not any(a.keyword is not None and a.keyword.value == "device" for a in expr.args)


def _move_where_made(ctx: Context, facts: Facts, plan: EditPlan, use: cst.Call, name: str, done: set[int]) -> None:
    function = ctx.function(use)
    scope = function if function is not None else ctx.module
    statement = ctx.statement(use)
    if name in _batch_names(ctx, facts, use):
        return  # a batch of a prepared DataLoader: already on the device
    made = None
    made_by: cst.Call | None = None  # `xb, yb = get_batch()`: made by one of the script's functions
    for node in ctx.descendants(scope):
        if node is statement:
            break
        if isinstance(node, cst.Assign) and len(node.targets) == 1 and dotted(node.targets[0].target) == name:
            made, made_by = node, None
        elif isinstance(node, cst.Assign):
            for key, value, position in bindings(node):
                if key == name and position is not None and isinstance(value, cst.Call):
                    made, made_by = node, value
        elif isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and \
                node.func.attr.value in {"to", "cuda"} and dotted(node.func.value) == name:
            return  # moved by the script (now to accelerator.device)
    if made is None or not _same_loop(ctx, made, use):
        return  # data made once outside the loop (a dataset, a DataLoader's tensors): not an input moved per step
    if made_by is not None:
        _move_returned(ctx, plan, made_by, done)
        return
    value = made.value
    if any(isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in {"to", "cuda"}
           for n in ctx.descendants(value)):
        return
    from_data = isinstance(value, cst.Subscript) or (isinstance(value, cst.Call) and (
        ctx.qnames(value) & FACTORIES) and not any(a.keyword is not None and a.keyword.value == "device"
                                                   for a in value.args))
    if from_data:
        _move(ctx, plan, value, done)


def _move_returned(ctx: Context, plan: EditPlan, call: cst.Call, done: set[int]) -> None:
    """A batch helper of the script (`def get_batch(): ...; return x, y`) that makes its tensors without a device:
    what it returns is moved to `accelerator.device`."""
    name = call.func.value if isinstance(call.func, cst.Name) else None
    for function in (f for f in ctx.of_type(cst.FunctionDef) if f.name.value == name):
        moved = {dotted(n.func.value) for n in ctx.descendants(function) if isinstance(n, cst.Call)
                 and isinstance(n.func, cst.Attribute) and n.func.attr.value in {"to", "cuda"}}
        for ret in (r for r in ctx.descendants(function) if isinstance(r, cst.Return) and r.value is not None):
            elements = [e.value for e in ret.value.elements] if isinstance(ret.value, cst.Tuple) else [ret.value]
            for element in elements:
                key = dotted(element)
                if key in moved:
                    continue
                origin = _binding_in(ctx, function, key) if key else element
                if origin is not None and (isinstance(origin, cst.Subscript) or _unplaced_factory(ctx, origin)):
                    _move(ctx, plan, element, done)


def _binding_in(ctx: Context, function: cst.FunctionDef, key: str) -> cst.BaseExpression | None:
    found = None
    for node in ctx.descendants(function):
        if isinstance(node, cst.Assign):
            for target, value, position in bindings(node):
                if target == key and position is None:
                    found = value
    return found


def _same_loop(ctx: Context, made: cst.CSTNode, use: cst.CSTNode) -> bool:
    """`made` runs in the loop around `use` (a tensor made per step), or both are outside any loop."""
    def loop_of(node: cst.CSTNode):
        for ancestor in ctx.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return None
            if isinstance(ancestor, (cst.For, cst.While)):
                return ancestor
        return None

    loop = loop_of(made)
    return loop is not None and ctx.contains(loop, use) or loop_of(use) is None and loop is None


def _move(ctx: Context, plan: EditPlan, value: cst.BaseExpression, done: set[int]) -> None:
    if id(value) in done:
        return
    done.add(id(value))
    plan.edit(value, lambda u: cst.Call(func=cst.Attribute(value=u, attr=cst.Name("to")), args=[cst.Arg(
        accel("device"))]))
    plan.report.change(ctx.line(value), f"`{ctx.code(value)}` -> `{ctx.code(value)}.to(accelerator.device)`",
                       "a tensor the script makes itself reaches the model: it must be on the process's device "
                       "(on a GPU the model is there, not on the CPU)")


def _set_device_calls(ctx: Context, plan: EditPlan) -> None:
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


def _moves(ctx: Context, facts: Facts, plan: EditPlan) -> None:
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


def _data_parallel(ctx: Context, facts: Facts, plan: EditPlan) -> None:
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


def _device_string_comparisons(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    """`device == "cuda"` held while `device` was a string; `accelerator.device` is a torch.device, which never
    equals a string: compare its `.type` (or `str(device)` for "cuda:0"-style strings)."""
    names = facts.accelerator_devices
    for node in ctx.of_type(cst.Comparison):
        if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, (cst.Equal, cst.NotEqual,
                                                                                        cst.In, cst.NotIn)):
            continue
        sides = [node.left, node.comparisons[0].comparator]
        device = next((s for s in sides if dotted(s) in names), None)
        text = next((_string_value(s) for s in sides if _string_value(s) is not None), None)
        if device is None or text is None:
            continue
        attr = "type" if ":" not in text or isinstance(node.comparisons[0].operator, (cst.In, cst.NotIn)) else None

        def fix(u: cst.CSTNode, attr: str | None = attr, key: str = dotted(device) or "") -> cst.CSTNode:
            def one(side: cst.BaseExpression) -> cst.BaseExpression:
                if dotted(side) != key:
                    return side
                return cst.Attribute(value=side, attr=cst.Name(attr)) if attr else \
                    cst.Call(func=cst.Name("str"), args=[cst.Arg(side)])
            return u.with_changes(left=one(u.left), comparisons=[u.comparisons[0].with_changes(
                comparator=one(u.comparisons[0].comparator))])

        plan.edit(node, fix, uses_accelerator=False)
        new = f"{dotted(device)}.type" if attr else f"str({dotted(device)})"
        plan.report.change(ctx.line(node), f"`{ctx.code(node)}` compares `{new}`",
                           f"`{dotted(device)}` is now `accelerator.device`, a torch.device: compared with a string "
                           "it is never equal, and the branch would silently change")


TENSOR_MAKERS = {"torch.zeros", "torch.ones", "torch.randn", "torch.rand", "torch.empty", "torch.full",
                 "torch.arange", "torch.eye", "torch.randint", "torch.linspace", "torch.tensor"}


def _tensors_made_in_forward(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    """`h0 = torch.zeros(1, x.size(0), self.hidden)` in a model's forward lands on the CPU while the model and its
    input are on the process's device once prepared: it is made on the input's device."""
    for function in ctx.of_type(cst.FunctionDef):
        if function.name.value != "forward" or not inside_class(ctx, function, facts.model_classes):
            continue
        params = [p.name.value for p in function.params.params if p.name.value != "self"]
        if not params:
            continue
        source = params[0]
        for call in ctx.descendants(function.body):
            if type(call) is not cst.Call or not ctx.qnames(call) & TENSOR_MAKERS:
                continue
            if any(a.keyword is not None and a.keyword.value == "device" for a in call.args):  # type: ignore
                continue
            parent = ctx.parent(call)
            if isinstance(parent, cst.Attribute) and parent.attr.value in {"to", "cuda", "type_as"}:
                continue  # moved right after it is made
            arg = cst.Arg(value=cst.parse_expression(f"{source}.device"), keyword=cst.Name("device"),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
            plan.edit(call, lambda u, a=arg: u.with_changes(args=[*u.args[:-1], u.args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))] + [a] if u.args else [a]),
                uses_accelerator=False)
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` in `forward` gets `device={source}.device`",
                               "a tensor made in forward without a device stays on the CPU while the prepared "
                               "model and its input are on the process's GPU")
