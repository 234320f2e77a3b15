"""Library files (a module of classes and functions that a training script imports) must not create an
Accelerator when they are imported: it would pick the device and process group before the script's own setup,
and every `import` of the module would make one. In such a file the Accelerator is created where it is first
needed instead: `self.accelerator = Accelerator()` at the start of each class's `__init__` (the class's methods use
`self.accelerator`), and `accelerator = Accelerator()` at the start of a free function that uses it. Accelerator
objects share one process-wide state, so making several is cheap and they all agree.
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.context import Context

NAME = "accelerator"


def is_library(ctx: Context) -> bool:
    """No `if __name__ == "__main__":` block and nothing at module level but imports, definitions, constants."""
    for statement in ctx.module.body:
        if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(statement, cst.If):
            if "__name__" in ctx.code(statement.test):
                return False
            return False
        if isinstance(statement, cst.SimpleStatementLine):
            for small in statement.body:
                if isinstance(small, (cst.Import, cst.ImportFrom)):
                    continue
                if isinstance(small, cst.Expr) and isinstance(small.value, (cst.SimpleString, cst.ConcatenatedString)):
                    continue  # docstring
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and not any(
                        isinstance(n, cst.Call) for n in ctx.descendants(small)):
                    continue  # a constant
                return False
            continue
        return False
    return True


class LazyAccelerator(cst.CSTTransformer):
    """Rewrite the converted library so the Accelerator is created by the code that uses it (see module doc)."""

    def __init__(self) -> None:
        super().__init__()
        self.classes: list[dict] = []  # per class being visited: {"uses": bool}
        self.functions: list[dict] = []  # per function: {"self": bool, "uses": bool}
        self.attribute_names: set[int] = set()  # `.accelerator` in `x.accelerator` is not the variable

    def visit_ClassDef(self, node: cst.ClassDef) -> None:  # noqa: N802 - libcst's visitor names
        self.classes.append({"uses": False})

    def leave_ClassDef(self, original: cst.ClassDef, updated: cst.ClassDef) -> cst.ClassDef:  # noqa: N802
        info = self.classes.pop()
        if not info["uses"]:
            return updated
        body = list(updated.body.body)
        init = next((i for i, s in enumerate(body) if isinstance(s, cst.FunctionDef) and s.name.value == "__init__"),
                    None)
        creation = cst.parse_statement(f"self.{NAME} = Accelerator()\n")
        if init is None:
            body.insert(_after_docstring(body), cst.parse_statement(
                f"def __init__(self, *args, **kwargs):\n    super().__init__(*args, **kwargs)\n"
                f"    self.{NAME} = Accelerator()\n"))
        else:
            function = body[init]
            statements = list(function.body.body)
            statements.insert(_after_docstring(statements), creation)
            body[init] = function.with_changes(body=function.body.with_changes(body=statements))
        return updated.with_changes(body=updated.body.with_changes(body=body))

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:  # noqa: N802
        params = node.params.params
        is_method = bool(self.classes) and bool(params) and params[0].name.value == "self"
        self.functions.append({"self": is_method, "uses": False})

    def leave_FunctionDef(self, original: cst.FunctionDef, updated: cst.FunctionDef) -> cst.FunctionDef:  # noqa: N802
        info = self.functions.pop()
        if info["uses"] and not info["self"]:
            statements = list(updated.body.body)
            statements.insert(_after_docstring(statements), cst.parse_statement(f"{NAME} = Accelerator()\n"))
            return updated.with_changes(body=updated.body.with_changes(body=statements))
        return updated

    def visit_Attribute(self, node: cst.Attribute) -> None:  # noqa: N802
        self.attribute_names.add(id(node.attr))

    def leave_Name(self, original: cst.Name, updated: cst.Name):  # noqa: N802
        if updated.value != NAME or not self.functions or id(original) in self.attribute_names:
            return updated
        info = self.functions[-1]
        info["uses"] = True
        if info["self"]:
            self.classes[-1]["uses"] = True
            return cst.Attribute(value=cst.Name("self"), attr=cst.Name(NAME))
        return updated


def _after_docstring(body: list) -> int:
    if body and isinstance(body[0], cst.SimpleStatementLine) and body[0].body and \
            isinstance(body[0].body[0], cst.Expr) and isinstance(body[0].body[0].value, cst.SimpleString):
        return 1
    return 0
