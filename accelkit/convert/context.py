"""Read-only view of the parsed script: parents, positions and qualified names of every node.

The metadata is resolved once; every transform asks this object instead of running its own metadata pass.
"""

from __future__ import annotations

from collections.abc import Iterator

import libcst as cst
from libcst.metadata import MetadataWrapper, ParentNodeProvider, PositionProvider, QualifiedNameProvider


def _resolved(value: object) -> object:
    # MetadataWrapper.resolve hands back lazily computed values for some providers.
    return value() if callable(value) else value


class Context:
    """Parsed script plus the metadata the transforms need, keyed by node identity."""

    def __init__(self, wrapper: MetadataWrapper) -> None:
        self.wrapper = wrapper
        self.module: cst.Module = wrapper.module
        self._parents = wrapper.resolve(ParentNodeProvider)
        self._positions = wrapper.resolve(PositionProvider)
        self._qnames = wrapper.resolve(QualifiedNameProvider)
        self.nodes: list[cst.CSTNode] = []
        collector = _Collector(self.nodes)
        self.module.visit(collector)

    # --- navigation -------------------------------------------------------------------------------------------
    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def line(self, node: cst.CSTNode) -> int:
        pos = self._positions.get(node)
        return pos.start.line if pos is not None else 0

    def qnames(self, node: cst.CSTNode) -> set[str]:
        found = self._qnames.get(node)
        if found is None:
            return set()
        return {q.name for q in _resolved(found)}  # type: ignore[union-attr]

    def code(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node).strip()

    def of_type(self, *types: type) -> Iterator[cst.CSTNode]:
        return (n for n in self.nodes if isinstance(n, types))

    def statement(self, node: cst.CSTNode) -> cst.BaseStatement | None:
        """The statement line (simple line or compound statement) that contains `node`."""
        for candidate in [node, *self.ancestors(node)]:
            if isinstance(candidate, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
                return candidate
        return None

    def small_statement(self, node: cst.CSTNode) -> cst.BaseSmallStatement | None:
        for candidate in [node, *self.ancestors(node)]:
            if isinstance(candidate, cst.BaseSmallStatement):
                return candidate
            if isinstance(candidate, cst.BaseStatement):
                return None
        return None

    def function(self, node: cst.CSTNode) -> cst.FunctionDef | None:
        """The innermost function enclosing `node` (None at module level)."""
        for candidate in self.ancestors(node):
            if isinstance(candidate, cst.FunctionDef):
                return candidate
        return None

    def suite_of(self, statement: cst.BaseStatement) -> cst.Module | cst.IndentedBlock | None:
        """The block whose `body` lists `statement` (None for one-line suites such as `if x: y`)."""
        parent = self.parent(statement)
        if isinstance(parent, (cst.Module, cst.IndentedBlock)):
            return parent
        return None

    def top_statement_in(self, node: cst.CSTNode, suite: cst.Module | cst.IndentedBlock) -> cst.BaseStatement | None:
        """The statement of `suite.body` that contains `node`, if any."""
        for candidate in [node, *self.ancestors(node)]:
            if self.parent(candidate) is suite and isinstance(candidate, cst.BaseStatement):
                return candidate
        return None


class _Collector(cst.CSTVisitor):
    def __init__(self, out: list[cst.CSTNode]) -> None:
        self.out = out

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.out.append(node)
        return True


def dotted(expr: cst.BaseExpression) -> str | None:
    """`model` -> "model", `self.model` -> "self.model"; anything else -> None."""
    if isinstance(expr, cst.Name):
        return expr.value
    if isinstance(expr, cst.Attribute) and isinstance(expr.value, cst.Name):
        return f"{expr.value.value}.{expr.attr.value}"
    return None


def accel(attr: str) -> cst.Attribute:
    """The expression `accelerator.<attr>`."""
    return cst.Attribute(value=cst.Name("accelerator"), attr=cst.Name(attr))


def accel_call(method: str, *args: cst.BaseExpression) -> cst.Call:
    return cst.Call(func=accel(method), args=[cst.Arg(a) for a in args])


def names_in(node: cst.CSTNode, skip: set[cst.CSTNode] | None = None) -> set[str]:
    """Every dotted name (`x`, `self.x`) referenced inside `node` (ignoring the subtrees in `skip`)."""
    found: set[str] = set()
    skipped = skip or set()

    class _Names(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            return n not in skipped and super().on_visit(n)

        def visit_Name(self, n: cst.Name) -> None:
            found.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            name = dotted(n)
            if name:
                found.add(name)
            n.value.visit(self)  # the attribute's own name (`.model` in `self.model`) is not a variable
            return False

    node.visit(_Names())
    return found


def contains_backward(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Name) and n.value == "backward" for n in _walk(node))


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []
    node.visit(_Collector(out))
    return out
