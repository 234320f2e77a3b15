"""Find what a single-device training script is made of: models, optimizers, loaders, schedulers, AMP scalers,
device variables, loops over loaders, argument parsing, and any distributed code that makes it unconvertible.

Objects are tracked by their dotted name (`model`, `self.model`); a parameter with the same name in a helper
(`def train(args, model, device, loader, optimizer, epoch)`) is taken to be the same object, as it is in practice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from accelkit.convert.batch_sources import custom_source
from accelkit.convert.context import Context, dotted, walk

SCALERS = {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
           "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"}
AUTOCASTS = {"torch.cuda.amp.autocast", "torch.amp.autocast", "torch.autocast", "torch.cuda.amp.autocast_mode.autocast",
             "torch.amp.autocast_mode.autocast"}
DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                 "torch.nn.parallel.data_parallel.DataParallel",
                 # a DDP wrap goes like a DataParallel one (prepare wraps); see transforms/distributed.py
                 "torch.nn.parallel.DistributedDataParallel", "torch.nn.parallel.distributed.DistributedDataParallel"}
DISTRIBUTED = {
    "torch.multiprocessing.spawn": "it spawns its own worker processes (torch.multiprocessing.spawn)",
    "torch.multiprocessing.start_processes": "it starts its own worker processes (torch.multiprocessing)",
    "torch.multiprocessing.Process": "it trains in worker processes it starts itself (torch.multiprocessing.Process, "
                                     "Hogwild-style shared memory)",
    "multiprocessing.Process": "it trains in worker processes it starts itself (multiprocessing.Process)",
    "deepspeed.initialize": "it calls deepspeed.initialize",
    "torch.distributed.fsdp.FullyShardedDataParallel": "it wraps a model in FSDP",
}
# Method calls that return the same module/tensor: `Net().to(device)` is still a `Net()` creation.
CHAIN_METHODS = {"to", "cuda", "cpu", "float", "double", "half", "bfloat16", "train", "eval"}
NOT_MODELS = {"Parameter", "ParameterList", "ParameterDict", "DataParallel", "Identity"}


@dataclass
class Tracked:
    key: str  # dotted name the object is bound to
    kind: str  # model | optimizer | loader | scheduler | scaler
    value: cst.BaseExpression  # the creating expression (without `.to(...)` chains)
    statement: cst.SimpleStatementLine | None = None  # `key = <creation>` line
    small: cst.BaseSmallStatement | None = None  # the Assign/Return inside it
    returned: bool = False  # created in `return <creation>`
    origin: str = "created"  # created | call (bound from a factory function's result) | alias (`model = self.model`)
    factory: bool = False  # created in a function that hands it back to its caller (prepared there, not here)


@dataclass
class Facts:
    created: list[Tracked] = field(default_factory=list)
    kinds: dict[str, str] = field(default_factory=dict)
    wrappers: list[tuple[cst.BaseSmallStatement, cst.Call]] = field(default_factory=list)  # DataParallel sites
    device_names: set[str] = field(default_factory=set)
    loader_loops: list[tuple[cst.For, set[str]]] = field(default_factory=list)
    parse_args: cst.BaseStatement | None = None
    refusals: list[tuple[int, str]] = field(default_factory=list)
    uses_accelerate: bool = False
    amp_enabled: cst.BaseExpression | None = None
    amp_dtype: str | None = None  # fp16 | bf16 when the script uses AMP
    model_classes: set[str] = field(default_factory=set)
    factories: dict[str, list[str | None]] = field(default_factory=dict)  # function -> kind per returned position
    optimizer_models: dict[int, list[str]] = field(default_factory=dict)  # id(optimizer Tracked) -> model names
    accelerator_devices: set[str] = field(default_factory=set)  # names set to `accelerator.device` by the conversion
    # `DataLoader(...)` made where it is used, bound to no name: a loop's iterable, or an argument of the script's
    # own function or class (`Trainer(model, DataLoader(ds, batch_size=8), opt)`); prepared where it is made
    inline_loaders: list[cst.Call] = field(default_factory=list)
    in_containers: list[tuple[str, str, cst.Call]] = field(default_factory=list)  # (container, kind, creation)

    def kind(self, expr: cst.BaseExpression) -> str | None:
        key = dotted(expr)
        return None if key is None else self.kinds.get(key)

    def of_kind(self, kind: str) -> set[str]:
        return {k for k, v in self.kinds.items() if v == kind}


VIEWS = {"module", "_orig_mod"}  # the inner model of a DDP/DataParallel wrapper, of torch.compile


def strip_chain(expr: cst.BaseExpression) -> cst.BaseExpression:
    while (isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute)
           and expr.func.attr.value in CHAIN_METHODS):
        expr = expr.func.value
    return expr


def analyze(ctx: Context) -> Facts:
    facts = Facts()
    _find_refusals(ctx, facts)
    model_classes = _local_model_classes(ctx)
    facts.model_classes = model_classes
    _find_creations(ctx, facts, model_classes)
    _propagate_aliases(ctx, facts)
    _optimizers_by_use(ctx, facts)
    _models_from_optimizers(ctx, facts)
    _propagate_aliases(ctx, facts)
    _factories(ctx, facts)
    _loaders_by_name(ctx, facts)
    _loaders_into_parameters(ctx, facts)
    _find_devices_and_loops(ctx, facts)
    _find_amp(ctx, facts)
    return facts


def classify(ctx: Context, expr: cst.BaseExpression, model_classes: set[str]) -> str | None:
    expr = strip_chain(expr)
    if not isinstance(expr, cst.Call):
        return None
    for q in ctx.qnames(expr):
        last = q.rsplit(".", 1)[-1]
        if q in SCALERS:
            return "scaler"
        if q in DATA_PARALLEL:
            return "dataparallel"
        if last == "DataLoader" and q.startswith("torch.utils.data"):
            return "loader"
        if q.startswith("torch.optim.lr_scheduler.") or re.match(r"transformers(\.\w+)*\.get_\w*schedule\w*$", q):
            return "scheduler"
        if q.startswith("torch.optim.") and last[:1].isupper():
            return "optimizer"
        if q.startswith("torch.nn.") and last[:1].isupper() and not last.endswith("Loss") and last not in NOT_MODELS:
            return "model"
        if q.startswith("torchvision.models.") or (q.startswith("transformers.") and last in
                                                    {"from_pretrained", "from_config"} and "Model" in q):
            return "model"
        if q in model_classes:
            return "model"
    return None


ENVIRONMENT_MAKERS = {"gym.make", "gymnasium.make", "gymnasium.make_vec", "gym.vector.make",
                      "gym.vector.SyncVectorEnv", "gym.vector.AsyncVectorEnv", "gymnasium.vector.SyncVectorEnv",
                      "gymnasium.vector.AsyncVectorEnv"}


def environments(ctx: Context, model_classes: set[str]) -> set[str]:
    """Names bound to a reinforcement-learning environment, whose `step(action)` hands out the training data: made
    by gym/gymnasium, or an instance of one of the script's classes with `reset` and `step` methods."""
    classes = {c.name.value for c in ctx.of_type(cst.ClassDef) if c.name.value not in model_classes and
               {"reset", "step"} <= {f.name.value for f in c.body.body if isinstance(f, cst.FunctionDef)}}
    found = set()
    for small in ctx.of_type(cst.Assign):
        for key, value, _ in bindings(small):
            if isinstance(value, cst.Call) and (ctx.qnames(value) & ENVIRONMENT_MAKERS or
                                                dotted(value.func) in classes):
                found.add(key)
    return found


def environment_call(ctx: Context, node: cst.CSTNode, envs: set[str], methods=("step",)) -> cst.Call | None:
    """The first `env.step(...)` (or another of `methods`) of an environment in `node`."""
    for call in ctx.descendants(node):
        if type(call) is cst.Call and isinstance(call.func, cst.Attribute) and \
                call.func.attr.value in methods and dotted(call.func.value) in envs:  # type: ignore[attr-defined]
            return call  # type: ignore[return-value]
    return None


def inside_class(ctx: Context, node: cst.CSTNode, classes: set[str]) -> bool:
    """True inside the code of a model class (its layers are not models to prepare)."""
    return any(isinstance(a, cst.ClassDef) and a.name.value in classes for a in ctx.ancestors(node))


def _local_model_classes(ctx: Context) -> set[str]:
    """Classes defined in the script that subclass nn.Module (directly or through another such class)."""
    found: set[str] = set()
    classes = list(ctx.of_type(cst.ClassDef))
    for _ in range(3):  # a few rounds resolve chains like `class Big(Small)` with `class Small(nn.Module)`
        for cls in classes:
            for base in cls.bases:
                names = ctx.qnames(base.value) or {ctx.code(base.value)}
                if any(n.startswith("torch.nn.") or n in found for n in names):
                    found.add(cls.name.value)
    return found


def _find_refusals(ctx: Context, facts: Facts) -> None:
    for node in ctx.of_type(cst.Call, cst.ImportFrom):
        if isinstance(node, cst.ImportFrom):
            module = ctx.code(node.module) if node.module else ""
            if module == "accelerate" or module.startswith("accelerate."):
                facts.uses_accelerate = True
            continue
        for q in ctx.qnames(node):
            if q in DISTRIBUTED:
                facts.refusals.append((ctx.line(node), DISTRIBUTED[q]))
            if q.startswith("accelerate.") and q.rsplit(".", 1)[-1] == "Accelerator":
                facts.uses_accelerate = True


def bindings(small: cst.BaseSmallStatement) -> list[tuple[str, cst.BaseExpression | None, int | None]]:
    """(dotted target, value, position) of each name an assignment binds: `a, b = x, y` -> (a, x, None), (b, y,
    None); `a, b = f()` -> (a, f(), 0), (b, f(), 1); `a = b = v` -> (a, v, None), (b, v, None)."""
    if isinstance(small, cst.AnnAssign):
        key = dotted(small.target)
        return [(key, small.value, None)] if key and small.value is not None else []
    if not isinstance(small, cst.Assign):
        return []
    out: list[tuple[str, cst.BaseExpression | None, int | None]] = []
    for target in small.targets:
        node = target.target
        if isinstance(node, (cst.Tuple, cst.List)):
            names = [dotted(e.value) for e in node.elements]
            value = small.value
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(names):
                out += [(n, e.value, None) for n, e in zip(names, value.elements, strict=True) if n]
            else:
                out += [(n, value, i) for i, n in enumerate(names) if n]
        else:
            key = dotted(node)
            if key:
                out.append((key, small.value, None))
    return out


def assign_parts(small: cst.BaseSmallStatement) -> tuple[str | None, cst.BaseExpression | None]:
    """(dotted target or None, value) of `key = value` or `key: T = value`; (None, None) for anything else."""
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return dotted(small.targets[0].target), small.value
    if isinstance(small, cst.AnnAssign) and small.value is not None:
        return dotted(small.target), small.value
    return None, None


def _find_creations(ctx: Context, facts: Facts, model_classes: set[str]) -> None:
    for small in ctx.of_type(cst.Assign, cst.AnnAssign, cst.Return):
        line = ctx.parent(small)
        if not isinstance(line, cst.SimpleStatementLine) or inside_class(ctx, small, model_classes):
            continue
        if isinstance(small, cst.Return):
            key, value = None, small.value
        else:
            key, value = assign_parts(small)
            if key is None or ("." in key and not key.startswith("self.")):
                continue  # `model.head = nn.Linear(...)` changes a model, it does not make a new one
        if value is None:
            continue
        if key is not None and isinstance(value, (cst.List, cst.Tuple, cst.ListComp, cst.Dict, cst.DictComp)):
            _unnamed_in_container(ctx, facts, key, value, model_classes)
            continue
        kind = classify(ctx, value, model_classes)
        if kind == "dataparallel":
            call = strip_chain(value)
            facts.wrappers.append((small, call))  # type: ignore[arg-type]
            inner = call.args[0].value if call.args else None  # type: ignore[union-attr]
            if inner is None or (key is not None and dotted(inner) == key):
                continue  # `model = nn.DataParallel(model)`: a wrap, not a creation
            kind = classify(ctx, inner, model_classes)
            value = strip_chain(inner)
        if kind is None:
            continue
        if key is not None:
            facts.kinds.setdefault(key, kind)
        facts.created.append(Tracked(key or "", kind, strip_chain(value), line, small, key is None))


def _unnamed_in_container(ctx: Context, facts: Facts, key: str, value: cst.BaseExpression,
                          model_classes: set[str]) -> None:
    """`nets = [Net(), Net(bn=True)]`, `opts = [Adam(n.parameters()) for n in nets]`: models or optimizers made
    inside a container have no name to prepare them by. Layers gathered for a model (`nn.Sequential(*layers)`,
    `nn.ModuleList(blocks)`) are parts of that model, not models of their own."""
    for call in ctx.of_type(cst.Call):
        if any(dotted(a.value) == key for a in call.args) and classify(ctx, call, model_classes) == "model":
            return
    for node in ctx.descendants(value):
        kind = classify(ctx, node, model_classes) if isinstance(node, cst.Call) else None
        if kind in {"model", "optimizer"}:
            facts.in_containers.append((key, kind, node))  # type: ignore[arg-type]
            return


def _models_from_optimizers(ctx: Context, facts: Facts) -> None:
    """`optimizer = SGD(model.parameters())` (or `model.configure_optimizers(...)`) makes `model` a model even when
    its constructor is unknown; where it is bound just before (`model = self.model`), that binding is tracked."""
    for item in list(facts.created):
        if item.kind != "optimizer" or item.statement is None:
            continue
        for node in ctx.descendants(item.value):
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in {"parameters", "named_parameters", "configure_optimizers"}):
                continue
            key = dotted(node.func.value)
            if key is None or (isinstance(node.func.value, cst.Attribute) and key.split(".")[0] != "self"):
                continue
            known = facts.kinds.get(key) == "model"
            facts.kinds[key] = "model"
            creation = _last_assignment_before(ctx, item.statement, key)
            if creation is None or any(t.small is creation and t.key == key for t in facts.created):
                continue
            value = next(v for k, v, _ in bindings(creation) if k == key)
            value = strip_chain(value) if value is not None else value
            origin = "alias" if dotted(value) is not None else "created"
            if known and origin == "created" and classify(ctx, value, facts.model_classes) is None:
                origin = "call"
            facts.created.append(Tracked(key, "model", value, ctx.parent(creation), creation, origin=origin))
            owner = wrapper_of_view(value) if value is not None else None
            if owner is not None and facts.kinds.get(owner) != "model":  # build-nanogpt's `raw_model`
                facts.kinds[owner] = "model"
                made = _last_assignment_before(ctx, ctx.parent(creation), owner)
                if made is not None and not any(t.small is made for t in facts.created):
                    made_value = next(v for k, v, _ in bindings(made) if k == owner)
                    made_value = strip_chain(made_value) if made_value is not None else made_value
                    facts.created.append(Tracked(owner, "model", made_value, ctx.parent(made), made,
                                                 origin="alias" if dotted(made_value) is not None else "created"))


def wrapper_of_view(value: cst.BaseExpression) -> str | None:
    """`model` for the inner model the script takes from its wrapper (`model.module if ddp else model`,
    `model._orig_mod`): the same parameters as `model`, which is what gets prepared."""
    branches = [value.body, value.orelse] if isinstance(value, cst.IfExp) else [value]
    if not any(isinstance(b, cst.Attribute) and b.attr.value in VIEWS for b in branches):
        return None
    owners = {dotted(b.value if isinstance(b, cst.Attribute) and b.attr.value in VIEWS else b) for b in branches}
    return owners.pop() if len(owners) == 1 and None not in owners else None


def _last_assignment_before(ctx: Context, statement: cst.SimpleStatementLine, key: str):
    suite = ctx.suite_of(statement)
    if suite is None:
        return None
    body = list(suite.body)
    for line in reversed(body[: body.index(statement)]):
        if isinstance(line, cst.SimpleStatementLine):
            for small in line.body:
                if any(k == key for k, _, _ in bindings(small)):
                    return small
    return None


def _propagate_aliases(ctx: Context, facts: Facts) -> None:
    """`self.model = model` (or `self.model = model.to(gpu_id)`) gives `self.model` the kind of `model`."""
    assigns = [assign_parts(s) for s in ctx.of_type(cst.Assign, cst.AnnAssign)]
    # `loader = get_loader()` where get_loader() returns a DataLoader(...) it creates
    factories: dict[str, str] = {}
    for item in facts.created:
        function = ctx.function(item.small) if item.returned and item.small is not None else None
        if function is not None:
            factories[function.name.value] = item.kind
    for key, value in assigns:
        if key is not None and isinstance(value, cst.Call) and isinstance(value.func, cst.Name) \
                and value.func.value in factories:
            facts.kinds.setdefault(key, factories[value.func.value])
    for _ in range(2):
        for key, value in assigns:
            if key is None or value is None or key in facts.kinds:
                continue
            source = strip_chain(value)
            if isinstance(source, cst.Call) and ctx.qnames(source) & DATA_PARALLEL and source.args:
                source = source.args[0].value
            kind = facts.kind(source)
            if kind is not None:
                facts.kinds[key] = kind
    # a `self.model` created in a class is `model` when handed to helpers by its short name, and vice versa
    for key, kind in list(facts.kinds.items()):
        if key.startswith("self."):
            facts.kinds.setdefault(key[5:], kind)


def _find_devices_and_loops(ctx: Context, facts: Facts) -> None:
    for node in ctx.of_type(cst.Call, cst.For):
        if isinstance(node, cst.For):
            source = node.iter
            if isinstance(source, cst.Call) and ctx.code(source.func) in {"enumerate", "tqdm", "tqdm.tqdm"} \
                    and source.args:
                source = source.args[0].value
                target = node.target
                if ctx.code(node.iter.func) == "enumerate" and isinstance(target, cst.Tuple) and target.elements:
                    target = cst.Tuple(elements=target.elements[1:])
            else:
                target = node.target
            inline = isinstance(source, cst.Call) and classify(ctx, source, facts.model_classes) == "loader"
            if facts.kind(source) == "loader" or inline:
                facts.loader_loops.append((node, {n.value for n in walk(target) if isinstance(n, cst.Name)}))
            if inline and source not in facts.inline_loaders:
                facts.inline_loaders.append(source)  # type: ignore[arg-type]
            continue
        func = node.func
        if isinstance(func, cst.Attribute) and func.attr.value in {"to", "cuda"} and node.args \
                and node.args[0].keyword is None:
            key = dotted(node.args[0].value)
            if key:
                facts.device_names.add(key)
        for arg in node.args:
            if arg.keyword is not None and arg.keyword.value == "device":
                key = dotted(arg.value)
                if key:
                    facts.device_names.add(key)
        if isinstance(func, cst.Attribute) and func.attr.value in {"parse_args", "parse_known_args"} \
                and facts.parse_args is None:
            facts.parse_args = ctx.statement(node)


def _find_amp(ctx: Context, facts: Facts) -> None:
    for call in ctx.of_type(cst.Call):
        names = ctx.qnames(call)
        if not names & (SCALERS | AUTOCASTS):
            continue
        facts.amp_dtype = facts.amp_dtype or "fp16"
        for arg in call.args:
            if arg.keyword is None:
                continue
            if arg.keyword.value == "enabled" and facts.amp_enabled is None:
                facts.amp_enabled = arg.value
            if arg.keyword.value == "dtype" and "bfloat16" in ctx.code(arg.value):
                facts.amp_dtype = "bf16"


def _optimizers_by_use(ctx: Context, facts: Facts) -> None:
    """`self.optimizer = model.configure_optimizers(cfg)`: an object whose `.step()` runs in a function that also
    runs a backward pass is an optimizer, wherever it came from; its last assignment is its creation."""
    has_backward: set[int] = set()
    for call in ctx.of_type(cst.Call):
        if isinstance(call.func, cst.Attribute) and call.func.attr.value == "backward":
            function = ctx.function(call)
            # a module-level training loop (nanoGPT's train.py) counts as the module's own "function"
            has_backward.add(id(function) if function is not None else id(ctx.module))
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
            continue
        key = dotted(func.value)
        if key is not None and (facts.kinds.get(key) == "scaler" or re.search(r"scaler", key, re.I)) and call.args:
            key = dotted(call.args[0].value)  # `scaler.step(optimizer)`: the AMP way to step an optimizer
        function = ctx.function(call)
        scope = function if function is not None else ctx.module
        if key is None or key in facts.kinds or id(scope) not in has_backward:
            continue
        if function is None and key.startswith("self."):
            continue
        if re.search(r"sched|lr|scaler", key.rsplit(".", 1)[-1], re.I):
            continue
        creation = _assignment_of(ctx, key, function) if function is not None else _module_assignment_of(ctx, key)
        if creation is None:
            continue
        value = next(v for k, v, _ in bindings(creation) if k == key)
        if value is not None and facts.kind(strip_chain(value)) is not None:
            continue  # `self.optimizer = optimizer`: the object is tracked under its first name
        facts.kinds[key] = "optimizer"
        facts.created.append(Tracked(key, "optimizer", value, ctx.parent(creation), creation))  # type: ignore


def _module_assignment_of(ctx: Context, key: str):
    """The last module-level assignment of `key` (outside every function and class)."""
    found = None
    for node in ctx.of_type(cst.Assign, cst.AnnAssign):
        if ctx.function(node) is None and not any(isinstance(a, cst.ClassDef) for a in ctx.ancestors(node)) \
                and any(k == key for k, _, _ in bindings(node)):
            found = node
    return found


def _assignment_of(ctx: Context, key: str, near: cst.FunctionDef):
    """The last assignment of `key` in `near`, or (for `self.x`) in any method of `near`'s class."""
    scopes: list[cst.CSTNode] = [near]
    if key.startswith("self."):
        owner = next((a for a in ctx.ancestors(near) if isinstance(a, cst.ClassDef)), None)
        if owner is not None:
            scopes = [owner]
    found = None
    for scope in scopes:
        for node in ctx.descendants(scope):
            if isinstance(node, (cst.Assign, cst.AnnAssign)) and any(k == key for k, _, _ in bindings(node)):
                found = node
    return found


def _factories(ctx: Context, facts: Facts) -> None:
    """Functions that create models/optimizers/loaders and return them: their objects are prepared where the
    caller binds the result (`model, opt = build(args)`), after whatever the caller does to them first."""
    created_in: dict[int, dict[str, Tracked]] = {}
    for item in facts.created:
        function = ctx.function(item.small) if item.small is not None else None
        if function is not None and item.key:
            created_in.setdefault(id(function), {})[item.key] = item
    for ret in ctx.of_type(cst.Return):
        function = ctx.function(ret)
        if function is None or ret.value is None:
            continue
        values = list(ret.value.elements) if isinstance(ret.value, cst.Tuple) else [ret.value]
        kinds: list[str | None] = []
        for element in values:
            expr = element.value if isinstance(element, cst.Element) else element
            local = created_in.get(id(function), {}).get(dotted(expr) or "")
            kinds.append(local.kind if local is not None else classify(ctx, expr, facts.model_classes)
                         if isinstance(expr, cst.Call) else None)
        if not any(k in PREPARABLE for k in kinds):
            continue
        facts.factories[function.name.value] = kinds
        for element in values:
            expr = element.value if isinstance(element, cst.Element) else element
            local = created_in.get(id(function), {}).get(dotted(expr) or "")
            if local is not None:
                local.factory = True
    for small in ctx.of_type(cst.Assign):
        for key, value, position in bindings(small):
            call = strip_chain(value) if value is not None else None
            if not (isinstance(call, cst.Call) and isinstance(call.func, cst.Name)):
                continue
            kinds = facts.factories.get(call.func.value)
            if not kinds:
                continue
            kind = kinds[position] if position is not None and position < len(kinds) else \
                kinds[0] if position is None and len(kinds) == 1 else None
            if kind not in PREPARABLE:
                continue
            facts.kinds.setdefault(key, kind)
            facts.created.append(Tracked(key, kind, call, ctx.parent(small), small, origin="call"))  # type: ignore


PREPARABLE = {"model", "optimizer", "loader", "scheduler"}
LOADER_NAME = re.compile(r"loader|_dl$|^dl$|^dl_", re.I)
NOT_LOADER_CALLS = {"iter", "enumerate", "zip", "len", "list", "tuple", "next", "tqdm", "cycle", "range"}


def _loaders_by_name(ctx: Context, facts: Facts) -> None:
    """`train_loader, val_loader = get_loaders(cfg)` from a helper of another module (or any call the analysis
    cannot see into), then iterated: a DataLoader by its name and use. Left untracked, it would be neither prepared
    nor reported, and every process would train on all of the data."""
    iterated: set[str] = set()
    for node in ctx.of_type(cst.For, cst.Call):
        if isinstance(node, cst.For):
            source = node.iter
            while isinstance(source, cst.Call) and ctx.code(source.func).split(".")[-1] in NOT_LOADER_CALLS \
                    and source.args:
                source = source.args[0].value
            key = dotted(source)
        elif isinstance(node.func, cst.Name) and node.func.value == "iter" and node.args:
            key = dotted(node.args[0].value)
        else:
            continue
        if key:
            iterated.add(key)
    # `evaluate(model, val_loader)` with `def evaluate(model, loader): for x, y in loader:` iterates it too
    functions: dict[str, list[cst.FunctionDef]] = {}
    for function in ctx.of_type(cst.FunctionDef):
        functions.setdefault(function.name.value, []).append(function)
    for call in ctx.of_type(cst.Call):
        name = call.func.value if isinstance(call.func, cst.Name) else None
        for function in functions.get(name or "", []):
            params = [p.name.value for p in function.params.params]
            for position, arg in enumerate(call.args):
                param = arg.keyword.value if arg.keyword is not None else \
                    params[position] if position < len(params) else None
                key = dotted(arg.value)
                if param in iterated and key:
                    iterated.add(key)
    for small in ctx.of_type(cst.Assign):
        line = ctx.parent(small)
        if not isinstance(line, cst.SimpleStatementLine) or inside_class(ctx, small, facts.model_classes):
            continue
        for key, value, _ in bindings(small):
            call = strip_chain(value) if value is not None else None
            if key in facts.kinds or key not in iterated or not LOADER_NAME.search(key.rsplit(".", 1)[-1]) or \
                    not isinstance(call, cst.Call) or ctx.code(call.func).split(".")[-1] in NOT_LOADER_CALLS or \
                    (isinstance(call.func, cst.Name) and call.func.value in facts.factories) or \
                    custom_source(ctx, call) is not None:  # `train_loader = ShuffledBatches(x, y)`: not one
                continue
            facts.kinds[key] = "loader"
            facts.created.append(Tracked(key, "loader", call, line, small, origin="call"))


def models_of(ctx: Context, facts: Facts, optimizer: Tracked) -> list[str]:
    """The models an optimizer trains, by the names its creation uses: `SGD(model.parameters())`,
    `model.configure_optimizers(...)`, `make_optimizer(model, ...)`, or `params` built from them just before."""

    def variables(value: cst.CSTNode) -> list[cst.CSTNode]:
        out = []
        for node in ctx.descendants(value):
            parent = ctx.parent(node)
            if isinstance(parent, cst.Attribute) and parent.attr is node:
                continue  # `.model` in `self.model` is not a variable of its own
            out.append(node)
        return out

    nodes = variables(optimizer.value)
    function = ctx.function(optimizer.small) if optimizer.small is not None else None
    # one level of indirection: `params = [p for p in model.parameters() if ...]; opt = AdamW(params)`
    for node in list(nodes):
        if type(node) is cst.Name and function is not None and facts.kinds.get(node.value) != "model":
            creation = _assignment_of(ctx, node.value, function)
            if creation is not None and creation is not optimizer.small:
                nodes += [n for k, v, _ in bindings(creation) if k == node.value and v is not None
                          for n in variables(v)]
    found: list[str] = []
    for node in nodes:
        key = None
        if isinstance(node, cst.Attribute) and node.attr.value in {"parameters", "named_parameters",
                                                                     "configure_optimizers"}:
            key = dotted(node.value)
        elif isinstance(node, (cst.Name, cst.Attribute)) and facts.kinds.get(dotted(node) or "") == "model":
            key = dotted(node)
        if key and key not in found and facts.kinds.get(key) == "model":
            found.append(key)
    return found


def _loaders_into_parameters(ctx: Context, facts: Facts) -> None:
    """`evaluate(model, test_loader)` with `def evaluate(net, data)`: inside, `data` is a DataLoader too. So is
    `train_data` of `Trainer(model, loader, ...)` with `def __init__(self, model, train_data, ...)`, and then the
    `self.train_data` it keeps (the DDP tutorials' Trainer)."""
    functions: dict[str, list[cst.FunctionDef]] = {}
    for function in ctx.of_type(cst.FunctionDef):
        functions.setdefault(function.name.value, []).append(function)
    constructors = {c.name.value: f for c in ctx.of_type(cst.ClassDef) for f in c.body.body
                    if isinstance(f, cst.FunctionDef) and f.name.value == "__init__"}
    into_constructor = False
    for call in ctx.of_type(cst.Call):
        func = call.func
        name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
            else None
        constructor = constructors.get(name or "") if isinstance(func, cst.Name) else None
        for function in [constructor] if constructor is not None else functions.get(name or "", []):
            params = [p.name.value for p in function.params.params]
            if params and params[0] == "self" and (isinstance(func, cst.Attribute) or function is constructor):
                params = params[1:]
            for position, arg in enumerate(call.args):
                inline = isinstance(arg.value, cst.Call) and classify(ctx, arg.value, facts.model_classes) == "loader"
                if facts.kind(arg.value) != "loader" and not inline:
                    continue
                if inline and arg.value not in facts.inline_loaders:
                    facts.inline_loaders.append(arg.value)  # type: ignore[arg-type]
                param = arg.keyword.value if arg.keyword is not None else \
                    params[position] if position < len(params) else None
                if param and param not in facts.kinds:
                    facts.kinds[param] = "loader"
                    into_constructor |= function is constructor
    if into_constructor:
        _propagate_aliases(ctx, facts)  # `self.train_data = train_data`
