"""The Context's index (one code generation pass): every node libcst's own traversal reaches, with the same parent,
subtree and start line, in source order; imports and definitions resolve names as the script binds them."""

from __future__ import annotations

from pathlib import Path

import libcst as cst

from accelkit.convert.context import Context

WHITESPACE = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine, cst.Newline,
              cst.Comment)
CORPUS = sorted((Path(__file__).parents[2] / "data").rglob("*.py"))


class _Walk(cst.CSTVisitor):
    """libcst's own traversal: every node, and each node's parent."""

    def __init__(self) -> None:
        self.nodes: list[cst.CSTNode] = []
        self.parents: dict[int, cst.CSTNode] = {}
        self._stack: list[cst.CSTNode] = []

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._stack:
            self.parents[id(node)] = self._stack[-1]
        self.nodes.append(node)
        self._stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        self._stack.pop()


def test_the_index_holds_what_libcsts_traversal_reaches_on_every_corpus_script() -> None:
    checked = 0
    for path in CORPUS:
        try:
            module = cst.parse_module(path.read_text(encoding="utf-8"))
        except (cst.ParserSyntaxError, UnicodeDecodeError):
            continue
        ctx, walk = Context(module), _Walk()
        module.visit(walk)
        assert sorted(map(id, ctx.nodes)) == sorted(map(id, walk.nodes)), path
        code = [node for node in walk.nodes if not isinstance(node, WHITESPACE)]
        assert [id(n) for n in ctx.nodes if not isinstance(n, WHITESPACE)] == [id(n) for n in code], path
        for node in code:
            assert ctx.parent(node) is walk.parents.get(id(node)), path
        checked += 1
    assert checked >= 50


def test_lines_subtrees_and_names() -> None:
    source = ("import torch.optim as optim\nfrom torch import nn\n\n\n# a comment\ndef train(model):\n"
              "    opt = optim.SGD(model.parameters(), lr=0.1)\n    return nn.Linear(2, 2)\n")
    module = cst.parse_module(source)
    ctx = Context(module)
    function = next(ctx.of_type(cst.FunctionDef))
    call = next(ctx.of_type(cst.Call))
    assert ctx.line(function) == 6 and ctx.line(call) == 7  # its code line, not the comment above it
    assert ctx.contains(function, call) and not ctx.contains(call, function)
    assert ctx.qnames(call) == {"torch.optim.SGD"}
    linear = [c for c in ctx.of_type(cst.Call) if ctx.code(c).startswith("nn.")][0]
    assert ctx.qnames(linear) == {"torch.nn.Linear"} and ctx.line(linear) == 8
    assert ctx.function(call) is function
