"""Names that stand for a script's data: locals computed from it (`n = len(x)`, `end = min(i + bs, n)`) and
aliases of it (`data, target = train_x, train_y`).

Hand-made batches are sharded by the data's own names; a loop bounded or fed through such a name follows the shard
only when every binding of the name is computed from the data (a name also bound to a constant, a parameter or a
call result the converter cannot see through does not).
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import bindings
from accelkit.convert.context import Context

# methods that keep a tensor's samples as they are (dtype, device, a copy): `data = train_x.float()` is an alias
KEEP_SAMPLES = {"float", "double", "half", "long", "int", "bool", "to", "cuda", "cpu", "detach", "clone",
                "contiguous", "requires_grad_"}
DEPTH = 4  # how many names deep a chain is followed (`n = len(x)`, `steps = n // bs`, ...)


def assignments_of(ctx: Context, scope: cst.CSTNode, name: str) -> list[tuple[cst.CSTNode, cst.BaseExpression | None,
                                                                              int | None]]:
    """(statement, value, position) of every binding of `name` in `scope` itself (not in functions or classes
    defined in it), augmented assignments and loop targets included (their value is None: not known)."""
    found: list[tuple[cst.CSTNode, cst.BaseExpression | None, int | None]] = []
    owner = scope if isinstance(scope, cst.FunctionDef) else None
    for node in ctx.descendants(scope):
        if not isinstance(node, (cst.Assign, cst.AnnAssign, cst.AugAssign, cst.For, cst.CompFor)) or \
                ctx.function(node) is not owner or _in_class(ctx, node, scope):
            continue
        if isinstance(node, (cst.Assign, cst.AnnAssign)):
            found += [(node, value, position) for key, value, position in bindings(node) if key == name]
        elif any(type(n) is cst.Name and n.value == name for n in ctx.descendants(node.target)):
            found.append((node, None, None))  # `n += 1`, `for n in ...`: its value is not known
    return found


def _in_class(ctx: Context, node: cst.CSTNode, scope: cst.CSTNode) -> bool:
    for ancestor in ctx.ancestors(node):
        if ancestor is scope:
            return False
        if isinstance(ancestor, cst.ClassDef):
            return True
    return False


def computed_from(ctx: Context, scope: cst.CSTNode, expression: cst.CSTNode, data: set[str],
                  skip: frozenset[str] = frozenset()) -> list[cst.CSTNode] | None:
    """The assignments through which `expression` reads the data (`[]`: it names the data itself), or None when it
    does not read them. A local counts when every binding of it in `scope` is computed from the data."""
    names = {n.value for n in ctx.descendants(expression) if type(n) is cst.Name}
    if names & data:
        return []
    for name in sorted(names - skip):
        through = _local_of_the_data(ctx, scope, name, data, skip | {name}, DEPTH)
        if through is not None:
            return through
    return None


def _local_of_the_data(ctx: Context, scope: cst.CSTNode, name: str, data: set[str], skip: frozenset[str],
                       depth: int) -> list[cst.CSTNode] | None:
    if depth == 0:
        return None
    found = assignments_of(ctx, scope, name)
    if not found:
        return None
    through: list[cst.CSTNode] = []
    for statement, value, position in found:
        if value is None or position is not None:
            return None  # `n += 1`, a loop variable, `n, d = x.shape`: not known to follow the data
        names = {n.value for n in ctx.descendants(value) if type(n) is cst.Name}
        if not names & data:
            inner = next((t for t in (_local_of_the_data(ctx, scope, other, data, skip | {other}, depth - 1)
                                      for other in sorted(names - skip)) if t is not None), None)
            if inner is None:
                return None
            through += inner
        through.append(statement)
    return through


def alias_source(ctx: Context, scope: cst.CSTNode, name: str, within: cst.CSTNode) -> str | None:
    """The name `name` is an alias of when every binding of it in `within` (the training loop) is one
    (`data = train_x`, `data, target = train_x, train_y`, `inputs = dataset.float()`), else None."""
    found = [b for b in assignments_of(ctx, scope, name) if ctx.contains(within, b[0])]
    sources = {_aliased(value) if position is None else None for _, value, position in found}
    if len(sources) != 1:
        return None
    return sources.pop()


def _aliased(value: cst.BaseExpression | None) -> str | None:
    """`train_x` of `train_x`, `train_x.float()`, `train_x.to(device)`, `Variable(train_x)` (old tutorials)."""
    while isinstance(value, cst.Call):
        if isinstance(value.func, cst.Attribute) and value.func.attr.value in KEEP_SAMPLES:
            value = value.func.value
        elif _called(value.func) == "Variable" and len(value.args) >= 1 and value.args[0].keyword is None:
            value = value.args[0].value
        else:
            break
    return value.value if isinstance(value, cst.Name) else None


def _called(func: cst.BaseExpression) -> str | None:
    return func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else None
