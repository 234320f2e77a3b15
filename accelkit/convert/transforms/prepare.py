"""`accelerator.prepare(...)` for models, optimizers, DataLoaders and per-batch LR schedulers.

Where: a model is prepared together with its optimizer, in the block (function, loop or module body) where the
optimizer is created, under the name it has there (`model` in `Trainer.run` even when it was built in `main()` and
handed over as `self.model`); objects built by a function that returns them are prepared where the caller binds
them. When: right before the first statement that runs them (a loop, a forward call, handing them to a function
that trains), so everything that changes a model first (custom init, `apply(init_fn)`, loading weights, freezing,
a new head, a data-dependent init from `next(iter(loader))`, which is no first use of the loader) happens before DDP
copies rank 0's weights to every process. Schedulers: only those stepped with every
optimizer step (a prepared scheduler steps once per process, which is right for them and N times too fast for one
stepped per epoch); the others are left alone and the report says why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from accelkit.convert.analysis import Facts, Tracked, assign_parts, bindings, models_of, wrapper_of_view
from accelkit.convert.context import Context, dotted
from accelkit.convert.edits import EditPlan
from accelkit.convert.flow import Flow, references
from accelkit.convert.neighbours import converted_neighbour

PREPARED = {"model", "optimizer", "loader", "scheduler"}
KIND_ORDER = ["model", "optimizer", "loader", "scheduler"]
WHY = ("prepare() wraps the model for the launched backend (DDP/FSDP/DeepSpeed) and places it, shards each "
       "DataLoader across processes, and makes optimizer/scheduler steps work with mixed precision")
# method calls that change or inspect a model, optimizer or loader without running it: prepare goes after them
NOT_RUNNING = re.compile(r"^(apply|load_state_dict|state_dict|requires_grad_|train|eval|to|cuda|cpu|float|half|double|"
                         r"bfloat16|parameters|named_parameters|modules|named_modules|children|named_children|"
                         r"buffers|named_buffers|register_\w+|add_\w+|zero_grad|configure_optimizers|"
                         r"\w*init\w*|\w*reset\w*|\w*load\w*|\w*freeze\w*|tie_\w+|resize_\w+|gradient_checkpointing\w*|"
                         r"num_parameters|get_\w+|param_groups|dataset|batch_size|sampler)$")
ITERATING = {"enumerate", "zip", "iter", "list", "tuple", "sorted", "map", "filter", "next"}
HARMLESS_CALLS = {"len", "print", "isinstance", "type", "id", "repr", "str", "sum", "getattr", "hasattr", "setattr",
                  "list", "tuple", "sorted", "filter", "map", "zip", "enumerate", "max", "min"}


@dataclass
class Member:
    key: str
    kind: str
    item: Tracked | None  # None: bound outside this block (a parameter, a global, `self.x` set elsewhere)
    index: int = -1  # top-level statement of the block holding its creation (-1: before the block)
    latest: int = -1  # prepared before this statement of the block at the latest (-1: no such limit)


@dataclass
class Group:
    block: cst.CSTNode
    members: list[Member] = field(default_factory=list)


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    flow = Flow(ctx, facts)
    aliases = _alias_classes(ctx, facts, flow)
    items = [t for t in facts.created if t.kind in PREPARED and t.statement is not None and not t.factory
             and not t.returned]
    for item in facts.created:
        if item.returned and item.kind in PREPARED and not item.factory:
            _prepare_returned(ctx, plan, item)
    items = [t for t in items if t.kind != "scheduler" or _per_batch(ctx, facts, flow, plan, t)]
    if not flow.backward_calls and not any(t.kind == "optimizer" for t in facts.created):
        models = [t for t in facts.created if t.kind == "model" and t.small is not None]
        trainer = imported_trainer(ctx)
        if trainer is not None and converted_neighbour(ctx.qnames(trainer), ctx.directory) is not None:
            pass  # its module beside the script is converted already: the model is prepared there
        elif trainer is not None:
            plan.report.problem(ctx.line(trainer), f"training happens in imported code (`{ctx.code(trainer.func)}`, "
                                                   f"{sorted(ctx.qnames(trainer))[0]}): this file has no backward "
                                                   "pass and no optimizer; converted alone, every process would "
                                                   "train its own copy",
                                "convert the file that trains (accelkit convert FILE), preparing the model, "
                                "optimizer and loaders there; then write this one with --partial")
        elif any(handed_to_imported_code(ctx, flow, m.key) for m in models):
            # minGPT's projects: `Trainer(config, model, data).run()` with the Trainer in another file
            plan.report.problem(ctx.line(models[0].small), f"model `{models[0].key}` is trained elsewhere: this "
                                                           "file has no backward pass and no optimizer, so the "
                                                           "training happens in imported code the conversion "
                                                           "cannot see; converted alone, every process would "
                                                           "train its own copy",
                                "convert the file that trains it (accelkit convert FILE), preparing the model, "
                                "optimizer and loaders there; then write this one with --partial")
    groups = _plan_groups(ctx, facts, flow, plan, items, aliases)
    for group in groups:
        _place(ctx, flow, plan, group)
    _inventory(ctx, facts, plan, items)
    for loader in facts.inline_loaders:
        _prepare_inline(ctx, plan, loader)
    for container, kind, creation in facts.in_containers:
        if flow.backward_calls:
            plan.report.problem(ctx.line(creation), f"{kind}s made inside a container (`{container}`, line "
                                                    f"{ctx.line(creation)}) have no name to prepare them by: "
                                                    "converted, every process would train its own copy",
                                f"bind each {kind} to a name, prepare them (model and optimizer together), then "
                                f"build `{container}` from the prepared names")


def _prepare_inline(ctx: Context, plan: EditPlan, loader: cst.Call) -> None:
    """`for x, y in DataLoader(ds, ...):` or `train(model, DataLoader(ds, ...))`: the loader has no name to prepare
    with the model, so it is prepared where it is made. Left unprepared, every process would train on all of it."""
    plan.edit(loader, lambda u: cst.Call(func=cst.parse_expression("accelerator.prepare"), args=[cst.Arg(u)]))
    line = ctx.line(loader)
    plan.report.change(line, f"`{ctx.code(loader.func)}(...)` -> `accelerator.prepare({ctx.code(loader.func)}(...))` "
                             "where it is made", "a DataLoader bound to no name cannot be prepared with the model; "
                                                 "unprepared, every process would iterate all of it")
    plan.report.found_item("dataloader", ctx.code(loader.func), line, "made inline: prepared where it is made")


def handed_to_imported_code(ctx: Context, flow: Flow, key: str) -> bool:
    """`Trainer(config, model, data)` with `Trainer` imported: the model goes to code this file does not hold. A
    model only printed, counted or saved (`print(net)`, MorvanZhou's 303_build_nn_quickly.py) goes nowhere."""
    for call in ctx.of_type(cst.Call):
        if not any(dotted(a.value) == key for a in call.args):
            continue
        names = ctx.qnames(call)
        if any(q.startswith(("builtins.", "torch.", "numpy.", "math.")) for q in names):
            continue
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if name and (name in flow.functions or any(c.name.value == name for c in ctx.of_type(cst.ClassDef))):
            continue  # the script's own function or class: its body is read like the rest of the file
        return True
    return False


def imported_trainer(ctx: Context) -> cst.Call | None:
    """A `...Trainer(...)` class of another module (not torch's, not this file's) the script builds."""
    local = {c.name.value for c in ctx.of_type(cst.ClassDef)}
    for call in ctx.of_type(cst.Call):
        names = ctx.qnames(call)
        if any(re.search(r"Trainer$", q) and not q.startswith("torch.") and q.split(".")[-1] not in local
               and "." in q for q in names):
            return call
    return None


# -- schedulers -------------------------------------------------------------------------------------------------
def _per_batch(ctx: Context, facts: Facts, flow: Flow, plan: EditPlan, item: Tracked) -> bool:
    """Prepare a scheduler only when it steps with every optimizer step."""
    calls = [c for c in ctx.of_type(cst.Call) if isinstance(c.func, cst.Attribute) and c.func.attr.value == "step"
             and dotted(c.func.value) in {item.key, item.key.split(".")[-1], f"self.{item.key}"}]
    name = f"`{item.key}` ({ctx.code(item.value.func) if isinstance(item.value, cst.Call) else 'scheduler'})"
    line = ctx.line(item.small)
    if not calls:
        plan.report.found_item("scheduler", item.key, line, "not prepared: no `.step()` call found (add it to "
                               "accelerator.prepare only if it steps with every optimizer step)")
        return False
    cadences = {("metric" if c.args else flow.cadence(c)) for c in calls}
    where = ", ".join(str(ctx.line(c)) for c in calls)
    if cadences == {"batch"}:
        plan.report.found_item("scheduler", item.key, line, f"prepared: stepped with every optimizer step "
                                                            f"(line {where})")
        return True
    why = ("stepped with a metric (ReduceLROnPlateau-style)" if "metric" in cadences else
           "stepped once per epoch, not with every optimizer step")
    plan.report.found_item("scheduler", item.key, line, f"not prepared: {why} (line {where}); a prepared "
                                                        "scheduler steps once per process, so on N processes it "
                                                        "would move N times too fast")
    plan.report.leave(line, f"scheduler {name} is not prepared: {why} (line {where})",
                      "nothing: the epoch count is the same on every process, so it already follows the "
                      "single-process schedule")
    return False


# -- which objects are the same object --------------------------------------------------------------------------
def _alias_classes(ctx: Context, facts: Facts, flow: Flow) -> dict[str, str]:
    """Names that hold the same object, merged: `self.model = model`, `model = self.model`, and arguments handed
    to the script's own functions and classes (`Trainer(model)` -> `__init__(self, model)`)."""
    parent: dict[str, str] = {}

    def find(key: str) -> str:
        while parent.get(key, key) != key:
            key = parent[key]
        return key

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[ra] = rb

    tracked = set(facts.kinds)
    for small in ctx.of_type(cst.Assign):
        for key, value, position in bindings(small):
            source = dotted(_strip(value)) if value is not None and position is None else None
            if source and (source in tracked or key in tracked):
                union(key, source)
    for call in ctx.of_type(cst.Call):
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        if not name:
            continue
        targets = flow.functions.get(name, []) + flow.functions.get("__init__", []) if name[:1].isupper() else \
            flow.functions.get(name, [])
        if name[:1].isupper():  # a class: its __init__
            targets = [f for f in targets if f.name.value == "__init__" and _class_name(ctx, f) == name]
        for function in targets:
            params = [p.name.value for p in function.params.params]
            if params and params[0] == "self":
                params = params[1:]
            for position, arg in enumerate(call.args):
                key = dotted(arg.value)
                if key is None or key not in tracked:
                    continue
                if arg.keyword is not None:
                    union(arg.keyword.value, key)
                elif position < len(params):
                    union(params[position], key)
    for key in list(tracked):
        if key.startswith("self."):
            union(key, key[5:])
    return {key: find(key) for key in {*parent, *tracked}}


def _class_name(ctx: Context, function: cst.FunctionDef) -> str | None:
    owner = next((a for a in ctx.ancestors(function) if isinstance(a, cst.ClassDef)), None)
    return owner.name.value if owner is not None else None


def _strip(value: cst.BaseExpression) -> cst.BaseExpression:
    from accelkit.convert.analysis import strip_chain

    return strip_chain(value)


# -- groups -----------------------------------------------------------------------------------------------------
def _plan_groups(ctx: Context, facts: Facts, flow: Flow, plan: EditPlan, items: list[Tracked],
                 aliases: dict[str, str]) -> list[Group]:
    groups: dict[int, Group] = {}

    def group_of(block: cst.CSTNode) -> Group:
        return groups.setdefault(id(block), Group(block))

    optimized_in: dict[str, list[int]] = {}  # alias class of a model -> blocks where an optimizer trains it
    # models prepared before an `if` that makes their optional optimizer: (block, model, index of that `if`)
    before_branch: list[tuple[cst.CSTNode, str, cst.CSTNode]] = []
    for item in items:
        block = flow.block_of(item.statement)
        if block is None:
            plan.report.problem(ctx.line(item.small), f"{item.kind} `{item.key}` is created in a one-line block "
                                                       "and was not prepared",
                                f"put it on its own line, or add `{item.key} = accelerator.prepare({item.key})`")
            continue
        if item.kind == "model" and _reloaded_after_training(ctx, flow, item, block, items):
            plan.report.found_item("model", item.key, ctx.line(item.small),
                                   "bound again after training (a saved model loaded back for evaluation): not "
                                   "prepared, every process evaluates it as it is")
            continue
        branch = _one_sided_branch(ctx, item, block)
        optional = _optional_optimizer(ctx, facts, item, branch, block) if branch is not None else None
        if optional is not None:
            # `if args.use_optimizer: optimizer = AdamW(model.parameters())`, the model trained on both paths (by
            # hand on the other): the model is prepared on its own before the `if`, the optimizer inside it
            top = flow.top_statement(branch, block)
            before_branch += [(block, model, top) for model in optional]
            group_of(branch.body).members.append(Member(item.key, item.kind, item))
            group = group_of(block)
            group.members += [Member(m, "model", None) for m in optional if all(x.key != m for x in group.members)]
            plan.report.found_item("optimizer", item.key, ctx.line(item.small),
                                   f"optional (only when `{ctx.code(branch.test)}`): prepared inside that `if`, its "
                                   f"model{'s' if len(optional) > 1 else ''} "
                                   f"{', '.join(f'`{m}`' for m in optional)} before it")
            continue
        if branch is not None and item.kind in {"model", "optimizer"}:
            plan.report.problem(ctx.line(item.small), f"{item.kind} `{item.key}` is only created when "
                                                       f"`{ctx.code(branch.test)}` holds: prepared after the `if`, the "
                                                       "other path fails (NameError), and training on that path is "
                                                       "not prepared",
                                f"create `{item.key}` on every path (or prepare it inside the `if`, and the model "
                                "on the other path too)")
            continue
        group = group_of(block)
        group.members.append(Member(item.key, item.kind, item))
        if item.kind == "optimizer":
            for model in models_of(ctx, facts, item):
                optimized_in.setdefault(aliases.get(model, model), []).append(id(block))
                model = _stored_alias(ctx, block, model) or model
                if not any(m.key == model for m in group.members):
                    group.members.append(Member(model, "model", None))
    for group in groups.values():
        kept = []
        for member in group.members:
            root = aliases.get(member.key, member.key)
            elsewhere = [b for b in optimized_in.get(root, []) if b != id(group.block)]
            if member.kind == "model" and elsewhere and id(group.block) not in optimized_in.get(root, []):
                continue  # trained where its optimizer is: prepared there, with it
            if member.kind == "model" and root not in optimized_in and not _run_here(ctx, aliases, root):
                names = {key for key, value in aliases.items() if value == root} | {root}
                if any(handed_to_imported_code(ctx, flow, name) for name in names):
                    _handed_over(ctx, plan, member, aliases, root)
                else:  # built and printed or saved, never run nor trained (303_build_nn_quickly.py)
                    plan.report.found_item("model", member.key, ctx.line(member.item.small) if member.item and
                                           member.item.small else 0, "not prepared: nothing here runs or trains it")
                continue
            kept.append(member)
        for i, member in enumerate(kept):  # the wrapper is prepared, not the inner model the script took from it
            owner = _view_of(ctx, member) if member.kind == "model" else None
            if owner is not None:
                kept[i] = Member(owner, "model", None)
        # the latest binding of each name in the block is the one prepared
        by_key: dict[str, Member] = {}
        for member in kept:
            if member.key not in by_key or member.item is not None:
                by_key[member.key] = member
        group.members = list(by_key.values())
    for block, model, top in before_branch:
        body = list(block.body)  # type: ignore[attr-defined]
        for member in groups.get(id(block), Group(block)).members:
            if member.key == model and top in body:
                member.latest = body.index(top)
    return [g for g in groups.values() if any(m.item is not None or m.latest >= 0 for m in g.members)]


def _reloaded_after_training(ctx: Context, flow: Flow, item: Tracked, block: cst.CSTNode,
                             items: list[Tracked]) -> bool:
    """`model = torch.load(f)` after the training loop, the model trained under the same name bound before it, and
    no training after it: the best checkpoint loaded back for a test. That binding is not the model to prepare."""
    body = list(block.body)  # type: ignore[attr-defined]
    top = flow.top_statement(item.statement, block)
    if top not in body:
        return False
    index = body.index(top)
    training = [i for i, line in enumerate(body) if not isinstance(line, (cst.FunctionDef, cst.ClassDef))
                and flow.trains(line)]
    earlier = [t for t in items if t is not item and t.kind == "model" and t.key == item.key
               and flow.top_statement(t.statement, block) in body[:index]]
    return bool(earlier) and any(i < index for i in training) and not any(i >= index for i in training)


def _optional_optimizer(ctx: Context, facts: Facts, item: Tracked, branch: cst.If,
                        block: cst.CSTNode) -> list[str] | None:
    """The models of an optimizer made only under `branch` (used only under the same test), when each of them is
    created in `block` on every path, before that `if`: they are trained by hand on the other path."""
    if item.kind != "optimizer" or not isinstance(branch.body, cst.IndentedBlock) or \
            not ctx.contains(branch.body, item.statement):
        return None
    models = models_of(ctx, facts, item)
    body = list(block.body)  # type: ignore[attr-defined]
    top = ctx.top_statement_in(branch, block)  # type: ignore[arg-type]
    if not models or top not in body:
        return None
    before = body[:body.index(top)]
    return models if all(_bound_on_every_path(ctx, before, model) for model in models) else None


def _bound_on_every_path(ctx: Context, body: list, key: str) -> bool:
    """The last statement of `body` that binds `key` binds it whatever path runs: a plain assignment, or an
    `if`/`elif`/`else` chain whose every branch binds it (`if args.model == 'Transformer': model = ... else: ...`)."""
    def binds(node: cst.CSTNode) -> bool:
        return any(isinstance(n, (cst.Assign, cst.AnnAssign)) and any(k == key for k, _, _ in bindings(n))
                   for n in [node, *ctx.descendants(node)])

    def every_path(node: cst.CSTNode) -> bool:
        if isinstance(node, cst.If):
            other = node.orelse
            if other is None:
                return False
            rest = other if isinstance(other, cst.If) else other.body
            return binds(node.body) and (every_path(rest) if isinstance(rest, cst.If) else binds(rest))
        return isinstance(node, cst.SimpleStatementLine) and binds(node)

    last = next((line for line in reversed(body) if binds(line)), None)
    return last is not None and every_path(last)


def _view_of(ctx: Context, member: Member) -> str | None:
    """The wrapper a model name was taken from (`raw_model = model.module if ddp else model`): that is prepared
    (preparing the view too would wrap the same parameters in a second DDP)."""
    values = [member.item.value] if member.item is not None else \
        [v for a in ctx.of_type(cst.Assign) for k, v, p in bindings(a) if k == member.key and p is None]
    owners = {wrapper_of_view(v) for v in values if v is not None} - {None, member.key}
    return owners.pop() if len(owners) == 1 else None


def _one_sided_branch(ctx: Context, item: Tracked, block: cst.CSTNode) -> cst.If | None:
    """The `if` (inside the prepare block) that creates `item` in one branch only (no `else` binding it)."""
    for ancestor in ctx.ancestors(item.statement):
        if ancestor is block:
            return None
        if isinstance(ancestor, cst.If) and ctx.main_guard(item.statement) is not ancestor:
            inside_body = ctx.contains(ancestor.body, item.statement)
            other = ancestor.orelse if inside_body else ancestor.body
            binds = other is not None and any(isinstance(n, (cst.Assign, cst.AnnAssign)) and
                                              any(k == item.key for k, _, _ in bindings(n))
                                              for n in ctx.descendants(other))
            if not binds and _used_only_under(ctx, item, ancestor.test):
                return ancestor
    return None


def _used_only_under(ctx: Context, item: Tracked, test: cst.BaseExpression) -> bool:
    """Every use of the object sits under an `if` with the same test: the script runs without it on the other
    path (an optional optimizer). A name the script uses unconditionally exists on every path the original runs
    (an `if`/`elif` chain choosing the model), so preparing it after the chain is right."""
    wanted = ctx.code(test)
    for ref in references(ctx, ctx.module, item.key):
        if item.statement is not None and ctx.contains(item.statement, ref):
            continue
        if not any(isinstance(a, cst.If) and ctx.code(a.test) == wanted for a in ctx.ancestors(ref)):
            return False
    return True


def _run_here(ctx: Context, aliases: dict[str, str], root: str) -> bool:
    """Is the model called by this script (under any of its names), rather than only handed to imported code?"""
    names = {key for key, value in aliases.items() if value == root} | {root}
    return any(dotted(call.func) in names for call in ctx.of_type(cst.Call))


def _handed_over(ctx: Context, plan: EditPlan, member: Member, aliases: dict[str, str], root: str) -> None:
    line = ctx.line(member.item.small) if member.item is not None and member.item.small is not None else 0
    names = {key for key, value in aliases.items() if value == root} | {root}
    receivers = [call for call in ctx.of_type(cst.Call)
                 if any(dotted(arg.value) in names for arg in call.args)]
    converted = converted_neighbour({q for call in receivers for q in ctx.qnames(call)}, ctx.directory)
    if converted is not None:  # the user converted the training module first, as the to-do below says
        plan.report.found_item("model", member.key, line, f"not prepared here: it is handed to imported code in "
                                                          f"{converted.name}, which is converted already and "
                                                          "prepares it (with its optimizer)")
        return
    plan.report.found_item("model", member.key, line, "not prepared here: this script never runs it, it only hands "
                                                      "it to imported code (that code must prepare it, with its "
                                                      "optimizer)")
    # the training happens in another file: this one alone cannot be made data-parallel, and a "converted"
    # script that trains every process's own copy would be worse than none
    plan.report.problem(line, f"model `{member.key}` is only handed to imported code, which trains it: converted "
                              "alone, this script would train every process's own copy",
                        "convert the file that trains it (accelkit convert FILE) and prepare the model and its "
                        "optimizer there; then write this one with --partial")


def _stored_alias(ctx: Context, block: cst.CSTNode, key: str) -> str | None:
    """`self.model = model` in the block: the object lives on as `self.model` (what other methods train), so that
    is the name to prepare. Only in the block's own function: a class of a module-level script stores its
    `__init__` argument, which is no name of the module (`self` is not defined there)."""
    scope = block if isinstance(block, cst.FunctionDef) else ctx.function(block)
    for node in ctx.descendants(block):
        if isinstance(node, cst.Assign) and ctx.function(node) is scope:
            for target, value, position in bindings(node):
                if position is None and target.startswith("self.") and value is not None and \
                        dotted(_strip(value)) == key:
                    return target
    return None


# -- placement --------------------------------------------------------------------------------------------------
def _place(ctx: Context, flow: Flow, plan: EditPlan, group: Group) -> None:
    block = group.block
    body = list(block.body)  # type: ignore[attr-defined]
    index = {id(line): i for i, line in enumerate(body)}
    for member in group.members:
        if member.item is not None:
            top = flow.top_statement(member.item.statement, block)
            member.index = index[id(top)] if top is not None else -1
        else:
            member.index = _last_binding(ctx, flow, body, member.key, member.latest)
    members = sorted(group.members, key=lambda m: m.index)
    creations = {m.index for m in members if m.item is not None}

    def first_use(member: Member) -> int:
        for j in range(member.index + 1, len(body)):
            if j in creations or plan.is_removed(body[j]):
                continue
            if _runs(ctx, flow, plan, body[j], member):
                return j
        return len(body)

    batch: list[Member] = []
    bound = len(body)
    for member in members:
        if batch and member.index >= bound:
            _emit(ctx, flow, plan, block, body, batch, bound)
            batch, bound = [], len(body)
        batch.append(member)
        bound = min(bound, first_use(member), member.latest if member.latest > member.index else len(body))
    if batch:
        _emit(ctx, flow, plan, block, body, batch, bound)


def _last_binding(ctx: Context, flow: Flow, body: list, key: str, latest: int = -1) -> int:
    """The statement of `body` that last binds `key` before `latest` when set, else before the first statement that
    trains (when one binds it there): a binding after the training (the best checkpoint loaded back for a test) is
    not the model that trains."""
    bound = [i for i, line in enumerate(body) for node in ctx.descendants(line)
             if isinstance(node, (cst.Assign, cst.AnnAssign)) and any(k == key for k, _, _ in bindings(node))]
    if latest >= 0:
        return max((i for i in bound if i < latest), default=-1)
    training = next((i for i, line in enumerate(body) if not isinstance(line, (cst.FunctionDef, cst.ClassDef))
                     and flow.trains(line)), len(body))
    return max([i for i in bound if i < training] or bound, default=-1)


def _runs(ctx: Context, flow: Flow, plan: EditPlan, statement: cst.CSTNode, member: Member) -> bool:
    """`statement` runs (or hands over) the object, rather than building, changing or inspecting it."""
    for ref in references(ctx, statement, member.key):
        if any(a in plan.removed for a in ctx.ancestors(ref)):
            continue
        if not _passive(ctx, flow, ref, member):
            return True
    return False


def _passive(ctx: Context, flow: Flow, ref: cst.CSTNode, member: Member) -> bool:
    """How the object is used at `ref`: read, changed or inspected (passive), or run / handed over (not)."""
    node = ref
    parent = ctx.parent(node)
    # climb `model.fc.weight`, `model[0]`: what matters is what the whole expression is used for
    while isinstance(parent, (cst.Attribute, cst.Subscript)) and parent.value is node:
        grand = ctx.parent(parent)
        if isinstance(parent, cst.Attribute) and isinstance(grand, cst.Call) and grand.func is parent:
            return bool(NOT_RUNNING.match(parent.attr.value))  # a method call: `model.apply(f)` vs `model.generate()`
        node, parent = parent, grand
    if isinstance(parent, cst.Call) and parent.func is node:
        return node is not ref  # `model(x)` runs it; `model.fc(x)` too, but `model[0](x)` is rare enough
    if isinstance(parent, cst.Arg):
        call = ctx.parent(parent)
        if isinstance(call, cst.Call):
            name = call.func.value if isinstance(call.func, cst.Name) else None
            if member.kind == "loader" and name in ITERATING:
                return _first_batch(ctx, call)  # `for i, batch in enumerate(loader)` runs the loader
            if name in HARMLESS_CALLS or any(q.startswith(("builtins.print", "torch.nn.init"))
                                             for q in ctx.qnames(call)):
                return True
            if member.kind == "optimizer" and _creates_scheduler(ctx, call):
                return True
            local = flow.functions.get(name or "", [])
            if local and not any(_runs_parameter(ctx, flow, f, call, parent) for f in local):
                return True  # handed to the script's own init/load helper, which does not run it
        return False
    if isinstance(parent, (cst.For, cst.CompFor)) and parent.iter is node:
        return node is not ref  # `for p in model.parameters()` is passive; `for x in loader` runs the loader
    return True  # read into a variable, assigned to, compared, returned: nothing runs


def _creates_scheduler(ctx: Context, call: cst.Call) -> bool:
    return any(q.startswith("torch.optim.lr_scheduler.") or re.search(r"get_\w*schedule", q) for q in ctx.qnames(call))


def _runs_parameter(ctx: Context, flow: Flow, function: cst.FunctionDef, call: cst.Call, arg: cst.Arg) -> bool:
    """Does the script's `function` run the object passed as `arg` (call it, step it, iterate it, train)?"""
    params = [p.name.value for p in function.params.params]
    if params and params[0] == "self":
        params = params[1:]
    if arg.keyword is not None:
        name = arg.keyword.value
    else:
        position = list(call.args).index(arg)
        if position >= len(params):
            return True
        name = params[position]
    if flow.trains(function.body) or any(True for _ in flow.loops_in(function.body)):
        return True
    for ref in references(ctx, function.body, name):
        parent = ctx.parent(ref)
        if isinstance(parent, cst.Call) and parent.func is ref:
            return True
        if isinstance(parent, cst.Arg) and not _first_batch(ctx, ctx.parent(parent)):
            return True  # handed on: assume it runs
    return False


def _first_batch(ctx: Context, call: cst.CSTNode) -> bool:
    """`next(iter(loader))`: a look at the first batch (a data-dependent init such as ActNorm's, a shape). On the
    loader not yet prepared every process reads the same batch, the one the original reads, and a model initialised
    from it is then copied from rank 0 by prepare; prepared first, each process would read a batch of its own."""
    if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name) and call.func.value == "iter"):
        return False
    arg = ctx.parent(call)
    outer = ctx.parent(arg) if isinstance(arg, cst.Arg) else None
    return isinstance(outer, cst.Call) and isinstance(outer.func, cst.Name) and outer.func.value == "next"


def _rebuild_containers(ctx: Context, plan: EditPlan, lines: list, batch: list[Member], add) -> None:
    """`nets = [net_sgd, net_adam]` written between the objects' creation and their prepare holds the unprepared
    objects, and the loop trains through it (every process its own copy): the list is made again from the
    prepared names, right after the prepare. A container the conversion cannot rebuild is reported."""
    keys = {m.key for m in batch}
    for line in lines:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            value = small.value if isinstance(small, (cst.Assign, cst.AnnAssign)) else None
            literals = [n for n in (ctx.descendants(value) if value is not None else [])
                        if isinstance(n, (cst.List, cst.Tuple, cst.Set, cst.Dict))
                        and any(dotted(getattr(e, "value", e)) in keys for e in n.elements)]
            if not literals:
                continue
            target, _ = assign_parts(small)
            simple = target is not None and isinstance(value, (cst.List, cst.Tuple)) and value in literals and \
                all(dotted(e.value) for e in value.elements)
            held = [dotted(getattr(e, "value", e)) for n in literals for e in n.elements
                    if dotted(getattr(e, "value", e)) in keys]
            if not simple:
                plan.report.problem(ctx.line(small), f"`{', '.join(held)}` put in a container at line "
                                                     f"{ctx.line(small)} before it is prepared: the container "
                                                     "would hold the unprepared object",
                                    "build the container after the objects are prepared (or prepare them first)")
                continue
            add(cst.SimpleStatementLine([small.deep_clone()]))
            plan.report.change(ctx.line(small), f"`{ctx.code(small)}` made again after the prepare",
                               f"it holds {', '.join(f'`{k}`' for k in held)}, taken before the prepare: without "
                               "it the script would train the unprepared objects")


def _emit(ctx: Context, flow: Flow, plan: EditPlan, block: cst.CSTNode, body: list, batch: list[Member],
          bound: int) -> None:
    batch = sorted(batch, key=lambda m: (KIND_ORDER.index(m.kind), m.index))
    names = ", ".join(m.key for m in batch)
    depth = sum(isinstance(a, cst.IndentedBlock) for a in ctx.ancestors(body[0])) if body else 0
    code = f"{names} = accelerator.prepare({names})\n"
    if len(code) + 4 * depth > 100:  # keep long lines readable
        code = f"{names} = accelerator.prepare(\n    {names}\n)\n"
    statement = cst.parse_statement(code)
    last_creation = max(m.index for m in batch)
    if bound < len(body):
        plan.insert_before(body[bound], statement)
        anchor_line = ctx.line(body[bound])
        when = f"before line {anchor_line}, where they are first used"
    else:
        # nothing here runs them (they are stored for other methods): after the last statement that touches them
        touched = [i for i, line in enumerate(body) if i > last_creation and not plan.is_removed(line)
                   and any(references(ctx, line, m.key) for m in batch)]
        anchor = body[max([last_creation, *touched])]
        plan.insert_after(anchor, statement)
        anchor_line = ctx.line(anchor)
        when = f"after line {anchor_line}"
    where = flow.block_name(block)
    kinds = ", ".join(f"{m.key} ({m.kind})" for m in batch)
    plan.report.change(anchor_line, f"added `{names} = accelerator.prepare({names})` {when} in {where}: {kinds}",
                       WHY)
    end = bound if bound < len(body) else body.index(anchor) + 1
    _rebuild_containers(ctx, plan, body[min(m.index for m in batch) + 1:end], batch,
                        (lambda s: plan.insert_before(body[bound], s)) if bound < len(body) else
                        (lambda s: plan.insert_after(anchor, s)))
    function = ctx.function(body[0]) if body else None
    _declare_outer_names(ctx, plan, function, [m.key for m in batch])
    for member in batch:
        plan.prepared[member.key] = f"line {anchor_line} ({where})"
        plan.prepare_sites[member.key].append((function, anchor_line))


def _declare_outer_names(ctx: Context, plan: EditPlan, function: cst.FunctionDef | None, keys: list[str]) -> None:
    """A function that prepares a model, optimizer or loader it reads from the module (or an enclosing function)
    without binding it: the prepare's assignment would make the name local to the whole function, and its first
    read an UnboundLocalError. The name is declared `global` (or `nonlocal`) at the top of the function instead, so
    the prepared object replaces the outer one, for the other functions that use it too."""
    if function is None:
        return
    from libcst.metadata import FunctionScope, GlobalScope

    plain = [k for k in keys if k.isidentifier()]
    if not plain:
        return
    inner = ctx.scopes().get(function.body.body[0]) if function.body.body else None
    if not isinstance(inner, FunctionScope):
        return
    declared: dict[str, list[str]] = {"global": [], "nonlocal": []}
    for key in plain:
        if inner.assignments[key]:  # a parameter or a local of its own: the prepare rebinds that local
            continue
        outer = inner.parent
        while not isinstance(outer, GlobalScope) and not outer.assignments[key]:
            outer = outer.parent
        declared["global" if isinstance(outer, GlobalScope) else "nonlocal"].append(key)
    for word, names in declared.items():
        if names:
            plan.body_start[function.body].insert(0, cst.parse_statement(f"{word} {', '.join(names)}\n"))
            plan.report.change(ctx.line(function), f"`{word} {', '.join(names)}` added to `{function.name.value}()`",
                               f"it prepares {', '.join(f'`{n}`' for n in names)} from outside the function: "
                               "without the declaration the prepare would make each a local, unbound where the "
                               "function first reads it")


def _prepare_returned(ctx: Context, plan: EditPlan, item: Tracked) -> None:
    plan.edit(item.small, lambda u: u.with_changes(value=cst.Call(
        func=cst.Attribute(value=cst.Name("accelerator"), attr=cst.Name("prepare")), args=[cst.Arg(u.value)])))
    plan.report.change(ctx.line(item.small), f"`return {ctx.code(item.value)}` now returns it prepared", WHY)
    plan.prepared[f"return:{ctx.line(item.small)}"] = f"line {ctx.line(item.small)}"


# -- the inventory: one line per object ------------------------------------------------------------------------
def _inventory(ctx: Context, facts: Facts, plan: EditPlan, items: list[Tracked]) -> None:
    reported = {(f.kind, f.name) for f in plan.report.found}
    for item in facts.created:
        if item.kind not in {"model", "optimizer", "loader"} or (item.kind, item.key) in reported:
            continue
        line = ctx.line(item.small) if item.small is not None else 0
        if item.factory:
            action = "built and returned by a function: prepared where the caller binds it"
        elif item.returned:
            action = "prepared where it is returned"
        elif item.key in plan.prepared:
            action = f"prepared at {plan.prepared[item.key]}"
        else:
            action = None
        if action is None:
            if item.kind == "model" and item.origin != "alias":
                # trained elsewhere under another name, or never trained (evaluation only)
                trained = [k for k in plan.prepared if k in _same(item.key)]
                action = f"prepared as `{trained[0]}` at {plan.prepared[trained[0]]}" if trained else None
            if action is None:
                continue
        reported.add((item.kind, item.key))
        plan.report.found_item({"loader": "dataloader"}.get(item.kind, item.kind), item.key, line, action)


def _same(key: str) -> set[str]:
    short = key.split(".")[-1]
    return {key, short, f"self.{short}"}
