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
               "load_state", "check_trigger", "pad_across_processes", "save_model", "get_state_dict"}
RANK_TEST = re.compile(r"\b(is_main_process|is_local_main_process|process_index|local_process_index|"
                       r"local_rank|global_rank|rank|is_master|is_main)\b")


@dataclass(frozen=True)
class Finding:
    line: int  # line of the converted script
    what: str
    todo: str


def verify(code: str) -> list[Finding]:
    if "accelerator." not in code:
        return []
    tree = ast.parse(code)
    return [*_collectives_under_rank_conditions(tree), *_prepare_after_training(tree, code)]


def _accelerator_method(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "accelerator":
        return node.func.attr
    return None


def _rank_condition(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and RANK_TEST.fullmatch(n.id) or
               isinstance(n, ast.Attribute) and RANK_TEST.fullmatch(n.attr) for n in ast.walk(test))


def _collectives_under_rank_conditions(tree: ast.Module) -> list[Finding]:
    found: dict[int, Finding] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.If) and _rank_condition(node.test)):
            continue
        condition = ast.unparse(node.test)
        stack: list[ast.AST] = [*node.body, *node.orelse]
        while stack:
            child = stack.pop()
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue  # defined under the condition, run where it is called
            method = _accelerator_method(child)
            if method in COLLECTIVES and child.lineno not in found:  # type: ignore[attr-defined]
                found[child.lineno] = Finding(  # type: ignore[attr-defined]
                    child.lineno, f"`accelerator.{method}()` runs only under `if {condition}:`, so the processes "  # type: ignore[attr-defined]
                                  "that skip it leave the others waiting (a hang)",
                    f"move `accelerator.{method}()` out of the `if`, where every process runs it")
            stack.extend(ast.iter_child_nodes(child))
    return [found[line] for line in sorted(found)]


def _prepare_after_training(tree: ast.Module, code: str) -> list[Finding]:
    found: list[Finding] = []
    if "accelerator.prepare(" not in code or "accelerator.backward(" not in code:
        return found
    for node in ast.walk(tree):
        for name in ("body", "orelse", "finalbody"):
            body = getattr(node, name, None)
            if not isinstance(body, list):
                continue
            for index, statement in enumerate(body):
                prepared = _prepared_names(statement)
                if prepared:
                    finding = _trained_before(body[:index], prepared, statement.lineno)
                    if finding is not None:
                        found.append(finding)
    return found


def _trained_before(earlier: list[ast.stmt], prepared: set[str], line: int) -> Finding | None:
    for statement in earlier:
        nodes = list(ast.walk(statement))
        if not any(_accelerator_method(n) == "backward" for n in nodes):
            continue
        used = {n.id for n in nodes if isinstance(n, ast.Name)} & prepared
        if used:
            return Finding(line, f"`accelerator.prepare(...)` comes after line {statement.lineno}, which already "
                                 f"trains {', '.join(sorted(used))}: that training runs without the distributed "
                                 "wrapper", "prepare the model, optimizer and loaders before the training loop")
    return None


def _prepared_names(statement: ast.AST) -> set[str]:
    if isinstance(statement, ast.Assign) and _accelerator_method(statement.value) == "prepare":
        return {n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()
