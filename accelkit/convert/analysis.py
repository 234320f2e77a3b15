"""Find what a single-device training script is made of: models, optimizers, loaders, schedulers, AMP scalers,
device variables, loops over loaders, argument parsing, and any distributed code that makes it unconvertible.

Objects are tracked by their dotted name (`model`, `self.model`); a parameter with the same name in a helper
(`def train(args, model, device, loader, optimizer, epoch)`) is taken to be the same object, as it is in practice.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import libcst as cst

from accelkit.convert.context import Context, dotted, walk

SCALERS = {"torch.cuda.amp.GradScaler", "torch.amp.GradScaler", "torch.cuda.amp.grad_scaler.GradScaler",
           "torch.amp.grad_scaler.GradScaler", "torch.GradScaler"}
AUTOCASTS = {"torch.cuda.amp.autocast", "torch.amp.autocast", "torch.autocast", "torch.cuda.amp.autocast_mode.autocast",
             "torch.amp.autocast_mode.autocast"}
DATA_PARALLEL = {"torch.nn.DataParallel", "torch.nn.parallel.DataParallel",
                 "torch.nn.parallel.data_parallel.DataParallel"}
DISTRIBUTED = {
    "torch.distributed.init_process_group": "it calls torch.distributed.init_process_group",
    "torch.nn.parallel.DistributedDataParallel": "it wraps a model in DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel": "it wraps a model in DistributedDataParallel",
    "torch.multiprocessing.spawn": "it spawns its own worker processes (torch.multiprocessing.spawn)",
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

    def kind(self, expr: cst.BaseExpression) -> str | None:
        key = dotted(expr)
        return None if key is None else self.kinds.get(key)

    def of_kind(self, kind: str) -> set[str]:
        return {k for k, v in self.kinds.items() if v == kind}


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
    _models_from_optimizers(ctx, facts)
    _propagate_aliases(ctx, facts)
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
            if key is None:
                continue
        if value is None:
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


def _models_from_optimizers(ctx: Context, facts: Facts) -> None:
    """`optimizer = SGD(model.parameters())` makes `model` a model even when its constructor is unknown."""
    for item in list(facts.created):
        if item.kind != "optimizer" or item.statement is None:
            continue
        for node in ctx.descendants(item.value):
            if not (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute)
                    and node.func.attr.value in {"parameters", "named_parameters"}):
                continue
            key = dotted(node.func.value)
            if key is None or (isinstance(node.func.value, cst.Attribute) and key.split(".")[0] != "self"):
                continue
            if facts.kinds.get(key) == "model":
                continue
            facts.kinds[key] = "model"
            creation = _last_assignment_before(ctx, item.statement, key)
            if creation is not None:
                value = strip_chain(assign_parts(creation)[1])
                facts.created.append(Tracked(key, "model", value, ctx.parent(creation), creation))


def _last_assignment_before(ctx: Context, statement: cst.SimpleStatementLine, key: str):
    suite = ctx.suite_of(statement)
    if suite is None:
        return None
    body = list(suite.body)
    for line in reversed(body[: body.index(statement)]):
        if isinstance(line, cst.SimpleStatementLine):
            for small in line.body:
                if assign_parts(small)[0] == key:
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
            if facts.kind(source) == "loader":
                facts.loader_loops.append((node, {n.value for n in walk(target) if isinstance(n, cst.Name)}))
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
