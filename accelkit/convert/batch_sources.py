"""What a training loop iterates when it is not a DataLoader the converter can see: an iterator class or a generator
function of the script, or the result of a call into code it cannot read (another module's helper).

The closed-world rule: prepare() shards only DataLoaders (anything else it hands back unchanged), so such a source is
either traced to a DataLoader the script builds and hands it (then that DataLoader is prepared), or reported.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import libcst as cst

from accelkit.convert.context import Context, dotted

WRAPPERS = {"enumerate", "tqdm", "tqdm.tqdm", "iter", "trange"}  # seen through to the batches they wrap
LIST_MAKERS = {"list", "sorted", "tuple", "zip"}  # the script's own batches, materialised


@dataclass(frozen=True)
class CustomSource:
    """A batch source prepare() would not shard."""

    kind: str  # iterator class | generator function | call
    name: str  # the class, function or called name
    line: int  # where the class or function is defined; where it is called for code the converter cannot read
    call: cst.Call  # the construction / call the loop's batches come from

    def describe(self) -> str:
        if self.kind == "call":
            return (f"`{self.name}(...)` (line {self.line}), code the converter cannot see into, so nothing proves "
                    "its batches come from a DataLoader")
        return f"`{self.name}`, a batch {self.kind} of the script (line {self.line}), not a DataLoader"

    def short(self) -> str:
        if self.kind == "call":
            return "returned by code the converter cannot see into, not known to be a DataLoader"
        return f"a {self.kind} of the script, not a DataLoader"


def unwrap(ctx: Context, expr: cst.BaseExpression) -> cst.BaseExpression:
    """`enumerate(tqdm(loader, desc=...))` -> `loader`: progress bars and counters wrap the batches they hand on."""
    while isinstance(expr, cst.Call) and ctx.code(expr.func) in WRAPPERS and expr.args \
            and expr.args[0].keyword is None:
        expr = expr.args[0].value
    return expr


def iterator_classes(ctx: Context) -> dict[str, cst.ClassDef]:
    """Classes of the script that hand out items themselves (`__iter__` / `__next__`), other than DataLoaders and
    Datasets (whose base prepare() knows)."""
    return _cached(ctx, "classes", lambda: _iterator_classes(ctx))


def _iterator_classes(ctx: Context) -> dict[str, cst.ClassDef]:
    found = {}
    for node in ctx.of_type(cst.ClassDef):
        bases = " ".join(ctx.code(b.value) for b in node.bases)
        if "DataLoader" in bases or "Dataset" in bases or "Sampler" in bases:
            continue
        methods = {s.name.value for s in node.body.body if isinstance(s, cst.FunctionDef)}
        if methods & {"__iter__", "__next__"}:
            found[node.name.value] = node
    return found


def generator_functions(ctx: Context) -> dict[str, cst.FunctionDef]:
    """Functions of the script that `yield`."""
    def find() -> dict[str, cst.FunctionDef]:
        found: dict[str, cst.FunctionDef] = {}
        for node in ctx.of_type(cst.Yield):
            function = ctx.function(node)
            if function is not None:
                found.setdefault(function.name.value, function)
        return found
    return _cached(ctx, "generators", find)


_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # per script: the transforms ask once per loop


def _cached(ctx: Context, key: str, compute):
    store = _CACHE.setdefault(ctx, {})
    if key not in store:
        store[key] = compute()
    return store[key]


def defined(ctx: Context, name: str) -> bool:
    return any(n.name.value == name for n in ctx.of_type(cst.FunctionDef, cst.ClassDef))


def bound_call(ctx: Context, near: cst.CSTNode, name: str) -> cst.Call | None:
    """The last call bound to `name` (`batches = Batches(x, y)`) in the scope of `near`, or at module level."""
    function, line = ctx.function(near), ctx.line(near)
    found: dict[bool, cst.Call] = {}  # in the function (True) or at module level (False)
    for owner, at, value in _calls_bound(ctx).get(name, []):
        if (owner is None or owner is function) and at <= line:
            found[owner is not None] = value
    return found.get(True, found.get(False))


def _calls_bound(ctx: Context) -> dict[str, list[tuple[cst.FunctionDef | None, int, cst.Call]]]:
    """name -> (function, line, call) of every `name = call(...)` of the script, in order."""
    from accelkit.convert.analysis import bindings  # analysis imports this module

    def index() -> dict[str, list[tuple[cst.FunctionDef | None, int, cst.Call]]]:
        found: dict[str, list[tuple[cst.FunctionDef | None, int, cst.Call]]] = {}
        for node in ctx.of_type(cst.Assign):
            for key, value, position in bindings(node):
                if position is None and isinstance(value, cst.Call):
                    found.setdefault(key, []).append((ctx.function(node), ctx.line(node), value))
        return found
    return _cached(ctx, "bound", index)


def custom_source(ctx: Context, call: cst.Call) -> CustomSource | None:
    """The call makes a batch source prepare() would not shard: an iterator class or a generator of the script.
    (Calls into code the converter cannot see are judged by `unseen_call`.)"""
    name = ctx.code(call.func)
    classes, generators = iterator_classes(ctx), generator_functions(ctx)
    if name in classes:
        return CustomSource("iterator class", name, ctx.line(classes[name]), call)
    if name in generators:
        return CustomSource("generator function", name, ctx.line(generators[name]), call)
    return None


def unseen_call(ctx: Context, call: cst.Call) -> CustomSource | None:
    """A call whose result the converter cannot read: not defined in the script, not a builtin that makes a list,
    not a method of the data (`x.split(bs)`)."""
    name = ctx.code(call.func)
    if isinstance(call.func, cst.Attribute) and not ctx.qnames(call.func):
        return None  # `data.split(bs)`, `ids.chunk(n)`: a method of a value the script holds
    if name in LIST_MAKERS or name in WRAPPERS or name == "range" or defined(ctx, name.split(".")[0]):
        return None
    if not ctx.qnames(call.func) and not isinstance(call.func, cst.Name):
        return None
    return CustomSource("call", name, ctx.line(call), call)


def loop_source_call(ctx: Context, loop: cst.CSTNode) -> cst.Call | None:
    """The call that makes what a `for` loop iterates: inline (`for b in Batches(x)`) or bound to the name it
    iterates (`batches = Batches(x)`, then `for b in tqdm(batches)`)."""
    if not isinstance(loop, cst.For):
        return None
    source = unwrap(ctx, loop.iter)
    if isinstance(source, cst.Call):
        return source
    name = dotted(source)
    return bound_call(ctx, loop, name) if name else None


def loaders_handed_in(call: cst.Call, is_loader) -> list[cst.BaseExpression]:
    """Arguments of the construction that are DataLoaders (`DeviceBatches(DataLoader(...), device)`): the batches
    come from them, and they are prepared where they are made."""
    return [a.value for a in call.args if is_loader(a.value)]
