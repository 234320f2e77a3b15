"""Read-only view of the parsed script: parents, positions and qualified names of nodes.

One code generation pass records every node, its parent and its line; qualified names come from the script's own
import statements (`import torch.optim as optim` makes `optim.SGD` mean `torch.optim.SGD`). That is what libcst's
QualifiedNameProvider computes too, but it resolves every name of every scope and costs several times the parse;
scripts that shadow an imported name locally are rare enough to accept the difference.
"""

from __future__ import annotations

import builtins
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import libcst as cst
from libcst._nodes.internal import CodegenState  # noqa: PLC2701 - the hook libcst's own PositionProvider uses


class Context:
    """Parsed script plus the metadata the transforms need, keyed by node identity."""

    def __init__(self, module: cst.Module, directory: Path | None = None) -> None:
        self.module = module
        self.directory = directory  # the script's folder, where its own imported modules are found (None: unknown)
        self._code: dict[int, str] = {}
        # One code generation pass indexes the tree: it walks every node in source order without rebuilding any (a
        # visitor's traversal rebuilds every node, about a third of a conversion's time) and counts lines on the way.
        state = _IndexState(default_indent=module.default_indent, default_newline=module.default_newline)
        module._codegen(state)
        self.nodes: list[cst.CSTNode] = state.nodes
        self._parents = state.parents
        self._lines: dict[cst.CSTNode, int] = state.lines
        self._index = {id(node): i for i, node in enumerate(self.nodes)}
        self._ends = state.ends
        self._by_class: dict[type, list[cst.CSTNode]] = {}
        for node in self.nodes:
            self._by_class.setdefault(type(node), []).append(node)
        self._aliases, self._bound = _imported_and_defined(self.nodes)
        self._scopes = None

    # --- navigation -------------------------------------------------------------------------------------------
    def scopes(self):
        """libcst's scope of every node (ScopeProvider), worked out once, on first use: most conversions never ask."""
        if self._scopes is None:
            from libcst.metadata import MetadataWrapper, ScopeProvider

            self._scopes = MetadataWrapper(self.module, unsafe_skip_copy=True).resolve(ScopeProvider)
        return self._scopes

    def parent(self, node: cst.CSTNode) -> cst.CSTNode | None:
        return self._parents.get(node)

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def contains(self, outer: cst.CSTNode, node: cst.CSTNode) -> bool:
        """`node` lies strictly inside `outer`: a range test on the index (a walk up for nodes made after it)."""
        start, at = self._index.get(id(outer)), self._index.get(id(node))
        if start is None or at is None:
            return any(a is outer for a in self.ancestors(node))
        return start < at < self._ends[start]

    def descendants(self, node: cst.CSTNode) -> list[cst.CSTNode]:
        """`node` and everything under it, in source order (a slice of the index, no traversal)."""
        start = self._index[id(node)]
        return self.nodes[start:self._ends[start]]

    def following(self, node: cst.CSTNode, within: cst.CSTNode) -> list[cst.CSTNode]:
        """Nodes of `within` that come after `node`'s subtree."""
        end = self._ends[self._index[id(node)]]
        return self.nodes[end:self._ends[self._index[id(within)]]]

    def line(self, node: cst.CSTNode) -> int:
        """1-based line where `node` starts (a statement: its first code line, not the comments above it)."""
        found = self._lines.get(node)
        if found is not None:
            return found
        start = self._index.get(id(node))
        for later in self.nodes[start + 1:] if start is not None else ():  # first descendant with a position
            if later in self._lines:
                return self._lines[later]
        return 0

    def binds(self, name: str) -> bool:
        """The script binds `name` at some level by an import, a def or a class (a name a conversion must not take)."""
        return name in self._aliases or name in self._bound

    def qnames(self, node: cst.CSTNode) -> set[str]:
        """Fully qualified names a call or a dotted expression refers to (`{"torch.optim.SGD"}`), or empty."""
        if isinstance(node, cst.Call):
            node = node.func
        parts: list[str] = []
        while isinstance(node, cst.Attribute):
            parts.append(node.attr.value)
            node = node.value
        if not isinstance(node, cst.Name):
            return set()
        head = node.value
        if head in self._aliases:
            head = self._aliases[head]
        elif head not in self._bound and hasattr(builtins, head):
            head = f"builtins.{head}"
        return {".".join([head, *reversed(parts)])}

    def code(self, node: cst.CSTNode) -> str:
        key = id(node)
        if key not in self._index:  # a node made by a transform: its id may be reused, so it is not kept
            return self.module.code_for_node(node).strip()
        found = self._code.get(key)
        if found is None:  # the report quotes the same expressions many times
            found = self._code[key] = self.module.code_for_node(node).strip()
        return found

    def of_type(self, *types: type) -> Iterator[cst.CSTNode]:
        """Nodes of the given (possibly abstract) types in source order, from a per-class index: isinstance on
        libcst's ABC-based classes is slow enough to matter on every node."""
        classes = [cls for cls in self._by_class if issubclass(cls, types)]
        if len(classes) == 1:
            return iter(self._by_class[classes[0]])
        found = [node for cls in classes for node in self._by_class[cls]]
        found.sort(key=lambda node: self._index[id(node)])
        return iter(found)

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

    def main_guard(self, node: cst.CSTNode) -> cst.If | None:
        """The module-level `if __name__ == "__main__":` around `node` (outside any function), if any: its body is
        the script's main function in all but name."""
        for candidate in self.ancestors(node):
            if isinstance(candidate, (cst.FunctionDef, cst.ClassDef)):
                return None
            if isinstance(candidate, cst.If) and self.parent(candidate) is self.module and is_main_guard(candidate):
                return candidate
        return None

    def scope_body(self, node: cst.CSTNode) -> cst.Module | cst.IndentedBlock:
        """The body `node` runs in: its function's, the main guard's, or the module."""
        function = self.function(node)
        if function is not None and isinstance(function.body, cst.IndentedBlock):
            return function.body
        guard = self.main_guard(node)
        if guard is not None and isinstance(guard.body, cst.IndentedBlock):
            return guard.body
        return self.module

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


@dataclass
class _IndexState(CodegenState):
    """Code generation that emits nothing but indexes the tree: every node in source order, its parent, where its
    subtree ends, and the start line of small statements and expressions.

    libcst's PositionProvider records full start/end ranges of every node, which costs about as much as parsing;
    the report needs only start lines of a few nodes."""

    line: int = 1
    lines: dict = field(default_factory=dict)
    nodes: list = field(default_factory=list)
    parents: dict = field(default_factory=dict)
    ends: list = field(default_factory=list)  # ends[i]: index just past the last descendant of nodes[i]
    _stack: list = field(default_factory=list)  # indices of the nodes being generated

    def add_token(self, value: str) -> None:
        self.line += value.count("\n")

    def before_codegen(self, node: cst.CSTNode) -> None:
        if self._stack:
            self.parents[node] = self.nodes[self._stack[-1]]
        self._stack.append(len(self.nodes))
        self.nodes.append(node)
        self.ends.append(0)
        cls = type(node)
        wanted = _LINE_CLASSES.get(cls)
        if wanted is None:
            wanted = _LINE_CLASSES[cls] = issubclass(cls, (cst.BaseSmallStatement, cst.BaseExpression, cst.Arg))
        if wanted:
            self.lines[node] = self.line

    def after_codegen(self, node: cst.CSTNode) -> None:
        self.ends[self._stack.pop()] = len(self.nodes)


_LINE_CLASSES: dict[type, bool] = {}


def _imported_and_defined(nodes: list[cst.CSTNode]) -> tuple[dict[str, str], set[str]]:
    """(local name -> the dotted name its import binds, names the script's own def/class statements bind), from the
    nodes in source order (a later import of a name wins, as it does when the script runs)."""
    aliases: dict[str, str] = {}
    bound: set[str] = set()
    for node in nodes:
        kind = type(node)
        if kind is cst.Import:
            for alias in node.names:
                full = _dotted_name(alias.name)
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    aliases[alias.asname.name.value] = full
                else:
                    aliases.setdefault(full.split(".")[0], full.split(".")[0])
        elif kind is cst.ImportFrom:
            if node.module is None or node.relative or isinstance(node.names, cst.ImportStar):
                continue
            module = _dotted_name(node.module)
            for alias in node.names:
                name = _dotted_name(alias.name)
                local = alias.asname.name.value if alias.asname is not None else name  # type: ignore[union-attr]
                aliases[local] = f"{module}.{name}"
        elif kind is cst.FunctionDef or kind is cst.ClassDef:
            bound.add(node.name.value)
    return aliases, bound


class _Collector(cst.CSTVisitor):
    def __init__(self, out: list[cst.CSTNode]) -> None:
        self.out = out

    def on_visit(self, node: cst.CSTNode) -> bool:
        self.out.append(node)
        return True


def _dotted_name(node: cst.CSTNode) -> str:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        return f"{_dotted_name(node.value)}.{node.attr.value}"
    return ""


def is_main_guard(node: cst.If) -> bool:
    """`if __name__ == "__main__":` (either order, either quotes)."""
    test = node.test
    if not (isinstance(test, cst.Comparison) and len(test.comparisons) == 1
            and isinstance(test.comparisons[0].operator, cst.Equal)):
        return False
    sides = [test.left, test.comparisons[0].comparator]
    names = [s.value for s in sides if isinstance(s, cst.Name)]
    strings = [s.evaluated_value for s in sides if isinstance(s, cst.SimpleString)]
    return names == ["__name__"] and strings == ["__main__"]


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


def names_of(nodes: list[cst.CSTNode], parents: Context) -> set[str]:
    """Dotted names among already-listed nodes (see `names_in`), without a traversal."""
    found: set[str] = set()
    for node in nodes:
        if type(node) is cst.Name:
            parent = parents.parent(node)
            if not (type(parent) is cst.Attribute and parent.attr is node):  # type: ignore[union-attr]
                found.add(node.value)
        elif type(node) is cst.Attribute:
            name = dotted(node)
            if name:
                found.add(name)
    return found


def walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    """`node` and everything under it, by traversal (for nodes built after parsing; see `Context.descendants`)."""
    out: list[cst.CSTNode] = []
    node.visit(_Collector(out))
    return out
