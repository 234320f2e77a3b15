"""Static checks of the converted script itself: what `--check` would catch by running it, caught before it is
written. Two mistakes are visible in the code alone:

- a collective (`wait_for_everyone`, `reduce`, `gather`, `prepare`, ...) under a condition that only some processes
  meet (`if accelerator.is_main_process:`, `if rank == 0:`): the processes that skip it never arrive, and the
  others wait for them forever;
- `accelerator.prepare(...)` after the statement that already trains the objects it prepares: that training ran
  without DDP/FSDP (every process trained alone) and the prepared objects are never used.

Each finding names the line of the converted script. Python's `ast` keeps this cheap (no second libcst pass).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

COLLECTIVES = {"wait_for_everyone", "reduce", "gather", "gather_for_metrics", "prepare", "save_state",
               "load_state", "check_trigger", "pad_across_processes", "save_model"}
RANK_TEST = re.compile(r"\b(is_main_process|is_local_main_process|process_index|local_process_index|"
                       r"local_rank|global_rank|rank|is_master|is_main)\b")


@dataclass(frozen=True)
class Finding:
    line: int  # line of the converted script
    what: str
    todo: str


def verify(code: str) -> list[Finding]:
    tree = ast.parse(code)
    return [*_collectives_under_rank_conditions(tree), *_prepare_after_training(tree)]


def _accelerator_method(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "accelerator":
        return node.func.attr
    return None


def _collectives_under_rank_conditions(tree: ast.Module) -> list[Finding]:
    found: list[Finding] = []

    def visit(node: ast.AST, condition: str | None) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                visit(child, None)  # a function defined under the condition runs where it is called
                continue
            inner = condition
            if isinstance(child, ast.If) and RANK_TEST.search(ast.unparse(child.test)):
                for branch in (child.body, child.orelse):
                    for statement in branch:
                        visit_statement(statement, ast.unparse(child.test))
                visit(child.test, condition)
                continue
            method = _accelerator_method(child)
            if method in COLLECTIVES and condition is not None:
                found.append(Finding(child.lineno, f"`accelerator.{method}()` runs only under `if {condition}:`, "
                                                   "so the processes that skip it leave the others waiting (a hang)",
                                     f"move `accelerator.{method}()` out of the `if`, where every process runs it"))
            visit(child, inner)

    def visit_statement(statement: ast.AST, condition: str) -> None:
        wrapper = ast.Module(body=[statement], type_ignores=[])  # type: ignore[list-item]
        visit(wrapper, condition)

    visit(tree, None)
    return found


def _prepare_after_training(tree: ast.Module) -> list[Finding]:
    found: list[Finding] = []
    for body in _bodies(tree):
        for index, statement in enumerate(body):
            prepared = _prepared_names(statement)
            if not prepared:
                continue
            for earlier in body[:index]:
                if not any(_accelerator_method(n) == "backward" for n in ast.walk(earlier)):
                    continue
                used = {n.id for n in ast.walk(earlier) if isinstance(n, ast.Name)} & prepared
                if used:
                    names = ", ".join(sorted(used))
                    found.append(Finding(statement.lineno, f"`accelerator.prepare(...)` comes after line "
                                                           f"{earlier.lineno}, which already trains {names}: that "
                                                           "training runs without the distributed wrapper",
                                         "prepare the model, optimizer and loaders before the training loop"))
                    break
    return found


def _prepared_names(statement: ast.AST) -> set[str]:
    if isinstance(statement, ast.Assign) and _accelerator_method(statement.value) == "prepare":
        return {n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()


def _bodies(tree: ast.AST):
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if isinstance(body, list) and body and isinstance(body[0], ast.stmt):
                yield body
