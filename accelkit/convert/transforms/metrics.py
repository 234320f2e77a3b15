"""Metrics over a sharded dataset are reduced across processes.

Evaluation loops over a prepared DataLoader (`out = model(x)`, no backward): predictions and labels are gathered
with `gather_for_metrics` right after the forward, so everything the loop sums is summed over the whole dataset
(and the duplicates Accelerate pads the last batch with are dropped). Where that is not possible (the labels cannot
be told apart, the loss comes out of the model) and in training loops, the accumulators the script reads after the
loop (`total_loss += ...`, `correct += ...`, `seen += y.size(0)`) are summed across processes when the loop ends,
so "sum, then divide by len(loader.dataset)" prints the whole dataset's value; a division by `len(loader)` (this
process's batches) then counts every process's batches.
"""

from __future__ import annotations

import re

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context, dotted, names_in, names_of
from accelkit.convert.edits import EditPlan
from accelkit.convert.flow import Flow

PYTHON_NUMBERS = ("item", "size", "numel", "__len__")
LOSS = re.compile(r"(loss|criterion)", re.I)
MOVES = frozenset({"cuda", "to", "cpu", "float", "half", "double", "long", "int", "contiguous"})  # same samples


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    flow = Flow(ctx, facts)
    models = facts.of_kind("model")
    calls: dict[str, list[cst.Call]] = {}  # by the called name's last part: who calls an evaluating function
    for call in ctx.of_type(cst.Call):
        func = call.func  # type: ignore[attr-defined]
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if name:
            calls.setdefault(name, []).append(call)  # type: ignore[arg-type]
    for loop, batch_names in facts.loader_loops:
        if any(isinstance(n, cst.Yield) for n in ctx.descendants(loop.body)):
            continue  # a generator handing the loader's batches on: its caller trains or evaluates on them
        training = flow.trains(loop) or any(type(n) is cst.Attribute and n.attr.value in {"backward", "step"}
                                            for n in ctx.descendants(loop.body))
        if not training:  # `convert --check` must reach one to compare metrics
            plan.report.evaluation_loops.append(ctx.line(loop))
            every = _steps_between_evaluations(ctx, flow, loop, calls)
            if every is not None:
                plan.report.evaluation_every.append(every)
        if not training and not _sums_batch_means(ctx, loop) and _gather(ctx, plan, loop, batch_names, models):
            continue
        _reduce_accumulators(ctx, facts, plan, loop, training, batch_names)


def _steps_between_evaluations(ctx: Context, flow: Flow, loop: cst.For, calls: dict[str, list[cst.Call]]) \
        -> int | None:
    """N of an evaluation run every N training steps: the loop (or the call of the function holding it) sits under
    `if ... step % N == 0` inside the loop that steps the optimizer (makemore: `if step > 0 and step % 500 == 0:
    evaluate(...)` in its `while True:` training loop), so `convert --check` can say how many steps reach it."""
    sites: list[cst.CSTNode] = [loop]
    function = ctx.function(loop)
    if function is not None:
        name = function.name.value
        sites += [c for c in calls.get(name, []) if ctx.function(c) is not function]
    for site in sites:
        for test in (a.test for a in ctx.ancestors(site) if isinstance(a, cst.If)):
            every = _modulo_zero(test)
            outer = flow.innermost_loop(site) if every is not None else None
            if outer is not None and (flow.runs(outer, flow.optimizer_steps) or flow.trains(outer)):
                return every
    return None


def _modulo_zero(test: cst.BaseExpression) -> int | None:
    """N of `x % N == 0` in a test (alone or under `and`)."""
    for node in [test, *_walk(test)]:
        if isinstance(node, cst.Comparison) and len(node.comparisons) == 1 and \
                isinstance(node.comparisons[0].operator, cst.Equal) and \
                isinstance(node.comparisons[0].comparator, cst.Integer) and \
                node.comparisons[0].comparator.evaluated_value == 0 and \
                isinstance(node.left, cst.BinaryOperation) and isinstance(node.left.operator, cst.Modulo) and \
                isinstance(node.left.right, cst.Integer) and node.left.right.evaluated_value > 1:
            return node.left.right.evaluated_value
    return None


def _walk(node: cst.CSTNode):
    for child in node.children:
        yield child
        yield from _walk(child)


def _sums_batch_means(ctx: Context, loop: cst.For) -> bool:
    """`total += criterion(out, y).item()`: a sum of per-batch *mean* losses depends on the batch size; gathered,
    each term would be the mean over N processes' batches (and there would be N times fewer terms). Summed per
    process and then across processes, it is the one-process sum (each process has the script's batch size)."""
    for node in ctx.descendants(loop.body):
        if not (isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign)):
            continue
        value = node.value
        if isinstance(value, cst.BinaryOperation):
            continue  # `loss.item() * x.size(0)`: weighted back to a sum
        for call in ctx.descendants(value):
            if type(call) is not cst.Call:
                continue
            func = call.func  # type: ignore[attr-defined]
            name = func.attr.value if isinstance(func, cst.Attribute) else func.value if isinstance(func, cst.Name) \
                else ""
            if LOSS.search(name) and not any(a.keyword is not None and a.keyword.value == "reduction"
                                             for a in call.args) and not _sums_inside(ctx, name):  # type: ignore
                return True
    return False


def _sums_inside(ctx: Context, name: str) -> bool:
    """`loss_function(...)`, a function of this script whose losses are asked for as sums (`reduction='sum'`)."""
    for function in ctx.of_type(cst.FunctionDef):
        if function.name.value != name:
            continue
        calls = [c for c in ctx.descendants(function.body) if type(c) is cst.Call]
        reductions = [ctx.code(a.value).strip("'\"") for c in calls for a in c.args  # type: ignore[attr-defined]
                      if a.keyword is not None and a.keyword.value == "reduction"]
        return bool(reductions) and all(r == "sum" for r in reductions)
    return False


def _gather(ctx: Context, plan: EditPlan, loop: cst.For, batch_names: set[str], models: set[str]) -> bool:
    found = _model_call(loop.body, models)
    if found is None:
        return False
    line, output, call = found
    inputs = names_of(ctx.descendants(call), ctx)
    later = names_of(ctx.following(line, loop.body), ctx)
    labels = [n for n in sorted(batch_names) if n not in inputs and n in later]
    aliases = _aliases_read_after(ctx, loop, line, batch_names, later)
    if aliases is None or not (labels or aliases):
        return False  # `n = y.size(0)` before the forward, read after it: it would keep the local count
    # inputs read after the forward (`loss * x.size(0)`) are gathered too: next to gathered outputs, a local
    # batch would weigh a global batch's loss by this process's share only
    labels += [n for n in sorted(batch_names) if n in inputs and n in later and n not in labels]
    labels += aliases  # `target_var = target.cuda()` read after the forward: gathered with the batch it renames
    names = ", ".join([output, *labels])
    plan.insert_after(line, cst.parse_statement(f"{names} = accelerator.gather_for_metrics(({names}))\n"))
    plan.report.change(ctx.line(line), f"added `{names} = accelerator.gather_for_metrics(({names}))` after it",
                       "each process evaluates a shard; gathering makes the metric cover the whole dataset")
    plan.report.found_item("metric", ", ".join(_accumulators(ctx, loop)) or output, ctx.line(loop),
                           "computed from predictions and labels gathered from every process (gather_for_metrics)")
    return True


def _aliases_read_after(ctx: Context, loop: cst.For, forward: cst.CSTNode, batch_names: set[str],
                        later: set[str]) -> list[str] | None:
    """Names bound from the batch before the forward and read after it. Gathering the batch names alone would
    rebind them to the whole batch, not these (a batch-size mismatch, or a local count next to global
    predictions). A rename of a batch tensor (`target_var = target`, `y = y_cpu.cuda()`) is gathered with it: the
    names returned. Anything else (`n = y.size(0)`): None, nothing can be gathered."""
    aliases: list[str] = []
    for node in ctx.descendants(loop.body):
        if node is forward:
            break
        if not isinstance(node, (cst.Assign, cst.AnnAssign)):
            continue
        targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
        value = node.value
        if value is None or not (names_of(ctx.descendants(value), ctx) & batch_names):
            continue
        bound = {n.value for t in targets for n in [t, *ctx.descendants(t)] if type(n) is cst.Name}
        read = sorted((bound - batch_names) & later)
        if not read:
            continue
        if len(targets) != 1 or type(targets[0]) is not cst.Name or _renamed(value) not in batch_names:
            return None
        aliases += [n for n in read if n not in aliases]
    return aliases


def _renamed(value: cst.BaseExpression) -> str | None:
    """The batch name a value only renames or moves: `target`, `target.cuda()`, `x.to(device).float()`."""
    while isinstance(value, cst.Call) and isinstance(value.func, cst.Attribute) and value.func.attr.value in MOVES:
        value = value.func.value
    return value.value if isinstance(value, cst.Name) else None


def _model_call(block: cst.BaseSuite, models: set[str]):
    """First `out = model(...)` line in the loop body (looking into `with` blocks)."""
    if not isinstance(block, cst.IndentedBlock):
        return None
    for line in block.body:
        if isinstance(line, cst.With):
            found = _model_call(line.body, models)
            if found is not None:
                return found
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)
                    and dotted(small.value.func) in models):
                output = dotted(small.targets[0].target)
                if output is not None and "." not in output:
                    return line, output, small.value
    return None


def _accumulators(ctx: Context, loop: cst.CSTNode) -> list[str]:
    out = []
    for node in ctx.descendants(loop):
        if isinstance(node, cst.AugAssign) and isinstance(node.operator, cst.AddAssign) and \
                isinstance(node.target, cst.Name) and node.target.value not in out:
            out.append(node.target.value)
    return out


def _reduce_accumulators(ctx: Context, facts: Facts, plan: EditPlan, loop: cst.For, training: bool,
                         batch_names: set[str]) -> None:
    if ctx.suite_of(loop) is None:
        return
    function = ctx.function(loop)
    after = ctx.following(loop, function if function is not None else ctx.module)  # the rest of the function
    read_after = names_of(after, ctx)
    returned = set()
    if function is not None:
        for node in ctx.descendants(function):
            if isinstance(node, cst.Return) and node.value is not None:
                returned |= names_of(ctx.descendants(node.value), ctx)
    statements = []
    names = []
    for name in _accumulators(ctx, loop):
        if name not in read_after and name not in returned:
            continue  # a running value logged and reset inside the loop: per process, like the loss
        increments = [n for n in ctx.descendants(loop) if isinstance(n, cst.AugAssign)
                      and isinstance(n.target, cst.Name) and n.target.value == name]
        number = all(_python_number(ctx, n.value) for n in increments)
        tail = ".item()" if number else ""
        statements.append(cst.parse_statement(
            f'{name} = accelerator.reduce(torch.as_tensor({name}, device=accelerator.device), "sum"){tail}\n'))
        names.append(name)
    if not statements:
        return
    for statement in statements:
        plan.insert_after(loop, statement)
    where = "training" if training else "evaluation"
    plan.report.change(ctx.line(loop), f"after the {where} loop: {', '.join(f'`{n}`' for n in names)} summed over "
                                       "all processes (accelerator.reduce)",
                       "each process only saw its shard of the loader; the value read after the loop must cover "
                       "every process's share")
    trimmed = not training and _cut_padding(ctx, plan, loop, batch_names, names)
    plan.report.found_item("metric", ", ".join(names), ctx.line(loop),
                           "summed across processes after the loop, each sample counted once (the samples "
                           "Accelerate repeats to even out the last batches are cut off first)" if trimmed else
                           "summed across processes after the loop (a last batch padded by Accelerate for an "
                           "uneven split is counted too)")
    _scale_per_process_lengths(ctx, facts, plan, after, set(names), _batch_counter(ctx, facts, loop))


def _batch_counter(ctx: Context, facts: Facts, loop: cst.For) -> str | None:
    """`i` of `for i, batch in enumerate(loader, 1)`: after the loop it is this process's number of batches."""
    call = loop.iter
    if not (isinstance(call, cst.Call) and ctx.qnames(call) == {"builtins.enumerate"} and len(call.args) == 2
            and facts.kind(call.args[0].value) == "loader"):
        return None
    start = call.args[1].value
    if not (isinstance(start, cst.Integer) and start.value == "1"):
        return None  # from 0 it ends at one less than the count: the script's own division is left as it is
    target = loop.target
    if isinstance(target, cst.Tuple) and target.elements and isinstance(target.elements[0].value, cst.Name):
        return target.elements[0].value.value
    return None


def _python_number(ctx: Context, value: cst.BaseExpression) -> bool:
    """The increment is a Python number (`loss.item()`, `y.size(0)`, `len(x)`, `1`), not a tensor."""
    if isinstance(value, (cst.Integer, cst.Float)):
        return True
    if isinstance(value, cst.BinaryOperation):
        return _python_number(ctx, value.left) or _python_number(ctx, value.right)
    if isinstance(value, cst.Call):
        func = value.func
        if isinstance(func, cst.Attribute) and func.attr.value in PYTHON_NUMBERS:
            return True
        if isinstance(func, cst.Name) and func.value in {"len", "int", "float"}:
            return True
    return isinstance(value, cst.Subscript) and isinstance(value.value, cst.Attribute) and \
        value.value.attr.value == "shape"


def _scale_per_process_lengths(ctx: Context, facts: Facts, plan: EditPlan, after: list[cst.CSTNode],
                               reduced: set[str], counter: str | None = None) -> None:
    """`total / len(loader)` (or `total / i` after `for i, batch in enumerate(loader, 1)`, `counter`), where `total`
    is one of the sums just `reduced`: a prepared loader has this process's batches only; every process's count is
    len(loader) * num_processes (prepared loaders give every process the same number of batches). Only a division
    of a reduced sum, once: an evaluation line after the training loop divides the evaluation's own sums (computed
    on gathered batches, or reduced after their own loop), and it was scaled by the training loop too."""
    for node in after:
        length = (isinstance(node, cst.Call) and isinstance(node.func, cst.Name) and node.func.value == "len"
                  and node.args and facts.kind(node.args[0].value) == "loader")
        if not (length or (counter is not None and isinstance(node, cst.Name) and node.value == counter)):
            continue
        parent = ctx.parent(node)
        if not (isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide)
                and parent.right is node) or id(node) in plan.counted:
            continue
        if not names_in(parent.left) & reduced:
            continue  # another sum: its own loop scales it, or it covers every process already (gathered)
        plan.counted.add(id(node))
        plan.edit(node, lambda u: cst.BinaryOperation(left=u, operator=cst.Multiply(),
                                                      right=cst.parse_expression("accelerator.num_processes"),
                                                      lpar=[cst.LeftParen()], rpar=[cst.RightParen()]))
        plan.report.change(ctx.line(node), f"`{ctx.code(node)}` -> `({ctx.code(node)} * accelerator.num_processes)`",
                           "the sum covers every process's batches now; so must the count")



def _cut_padding(ctx: Context, plan: EditPlan, loop: cst.For, batch_names: set[str], accumulators: list[str]) \
        -> bool:
    """An evaluation loop that sums per-sample values (`test_loss += F.mse_loss(..., reduction='sum').item()`, a
    loss the model returns, a correct count) or per-batch means (siamese: `test_loss += criterion(out, y).item()`)
    over a prepared loader: when the dataset does not split into whole batches on every process, Accelerate
    completes the last batches with samples from the start, and the sum would count them twice.
    `gradient_state.remainder` is the number of real samples in that last round, laid out by rank (what
    `gather_for_metrics` keeps): each process cuts its last batch to its real share before anything is computed
    from it, and a process whose share is 0 adds nothing. Each process's batches are the one-process run's batches
    (dealt round-robin), so both kinds of sum come out as on one process. The forward still runs on every process,
    on one sample at least (`x.view(x.size(0), -1)` fails on an empty batch), so a sharded model (FSDP) meets every
    collective. Only batches unpacked into names in the loop header are cut, and only when every increment of the
    accumulators is a line of its own (it goes under `if keep > 0:`)."""
    target = loop.target
    if isinstance(target, cst.Tuple) and isinstance(loop.iter, cst.Call) and dotted(loop.iter.func) == "enumerate" \
            and len(target.elements) == 2:
        target = target.elements[1].value
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(loop.body, cst.IndentedBlock):
        return False
    names = [e.value.value for e in target.elements if isinstance(e.value, cst.Name)]
    if len(names) != len(target.elements) or not set(names) <= batch_names:
        return False  # nested structures (`(x, (y, z))`) or starred names: left as they are
    increments = _increment_lines(ctx, loop, accumulators)
    if not increments:
        return False  # an increment shares its line with other statements: left as it is (reported)
    for line in increments:
        plan.edit(line, lambda u: cst.If(test=cst.parse_expression("keep > 0"),
                                         body=cst.IndentedBlock([u.with_changes(leading_lines=[])]),
                                         leading_lines=u.leading_lines))
    state = "accelerator.gradient_state"
    first = names[0]
    count = cst.parse_statement(f"keep = len({first})\n").with_changes(leading_lines=[cst.EmptyLine(
        comment=cst.Comment("# the last batches of an uneven split are completed with repeated samples: "
                            "count each sample once"))])
    cut = cst.parse_statement(
        f"if {state}.end_of_dataloader and {state}.remainder > 0:\n"
        f"    keep = min(max({state}.remainder - accelerator.process_index * len({first}), 0), len({first}))\n"
        f"    {', '.join(names)} = {', '.join(f'{n}[:max(keep, 1)]' for n in names)}\n")
    plan.body_start[loop.body] += [count, cut]
    plan.accelerator_uses.append(loop)
    plan.report.change(ctx.line(loop), f"cut the repeated samples off the last batch of the evaluation loop "
                                       f"(`{', '.join(names)}` to this process's real share; a process with none "
                                       "adds nothing)",
                       "the loop sums per-sample values or batch means; Accelerate pads the last batches to an even "
                       "split with samples from the start of the dataset, which the sum would count twice")
    return True


def _increment_lines(ctx: Context, loop: cst.For, accumulators: list[str]) -> list[cst.SimpleStatementLine]:
    """The lines of the loop that add to the accumulators, each a line of its own ([] when one is not)."""
    lines = []
    for node in ctx.descendants(loop.body):
        if isinstance(node, cst.AugAssign) and isinstance(node.target, cst.Name) and node.target.value in accumulators:
            line = ctx.parent(node)
            if not (isinstance(line, cst.SimpleStatementLine) and len(line.body) == 1):
                return []
            lines.append(line)
    return lines
