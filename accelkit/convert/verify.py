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
class Concern:
    line: int  # line of the converted script
    what: str
    todo: str


def find_concerns(code: str) -> list[Concern]:
    if "accelerator." not in code:
        return []
    tree = ast.parse(code)
    return [*_collectives_under_rank_conditions(tree), *_prepare_after_training(tree, code),
            *_trains_unprepared(tree, code), *_prepares_self(tree), *_accelerator_before_it_exists(tree)]


def _trains_unprepared(tree: ast.Module, code: str) -> list[Concern]:
    """A conversion that trains but prepares nothing: every process trains its own copy on its own batches, and
    the weights drift apart from the first step (not data-parallel, while looking converted)."""
    if "accelerator.prepare" in code:
        return []
    first = next((n for n in ast.walk(tree) if _accelerator_method(n) == "backward"), None)
    if first is None:
        return []
    return [Concern(first.lineno, "the script trains here, but no model is passed to `accelerator.prepare(...)`: "  # type: ignore[attr-defined]
                                  "every process would train its own copy (not data-parallel)",
                    "prepare the model and its optimizer before the training loop: "
                    "`model, optimizer = accelerator.prepare(model, optimizer)`")]


def _prepares_self(tree: ast.Module) -> list[Concern]:
    """`self, self.opt = accelerator.prepare(self, self.opt)` inside a module's own method: rebinding `self` is
    local to the method, so the wrapper is thrown away and each process trains the unwrapped module."""
    found = []
    for node in ast.walk(tree):
        if _accelerator_method(node) in {"prepare", "prepare_model"} and any(
                isinstance(a, ast.Name) and a.id == "self" for a in node.args):  # type: ignore[attr-defined]
            found.append(Concern(node.lineno, "`accelerator.prepare(self, ...)` inside the model's own class: the "  # type: ignore[attr-defined]
                                              "wrapped `self` is discarded when the method returns, so training "
                                              "runs on the unwrapped model (weights diverge across processes)",
                                 "build the model outside its class and prepare it there, with its optimizer"))
    return found


def _accelerator_before_it_exists(tree: ast.Module) -> list[Concern]:
    """Module-level code (what runs at import, in order) that uses `accelerator` before any module-level statement
    binds it: a NameError on every process (e.g. the Accelerator is made inside `main()`)."""
    bound = False
    for statement in _executed_in_order(tree.body):
        if isinstance(statement, ast.Global):
            continue
        uses = [n for n in ast.walk(statement) if isinstance(n, ast.Name) and n.id == "accelerator"
                and isinstance(n.ctx, ast.Load)]
        if uses and not bound:
            return [Concern(uses[0].lineno, "`accelerator` is used at module level before it exists (it is created "
                                            "later, or inside a function): a NameError on every process",
                            "create the Accelerator before this line, or leave this statement as it was")]
        if any(isinstance(n, ast.Name) and n.id == "accelerator" and isinstance(n.ctx, ast.Store)
               for n in ast.walk(statement)):
            bound = True
    return []


def _executed_in_order(body: list[ast.stmt]):
    """Module-level statements as they run, looking into `if`/`with`/`try`/loops, not into function and class
    bodies."""
    for statement in body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom)):
            continue
        nested = [getattr(statement, f, None) for f in ("body", "orelse", "finalbody", "handlers")]
        if isinstance(statement, (ast.If, ast.With, ast.Try, ast.For, ast.While)):
            header = [getattr(statement, "test", None), getattr(statement, "iter", None),
                      *[i.context_expr for i in getattr(statement, "items", [])]]
            yield from (ast.Expr(value=h, lineno=statement.lineno, col_offset=0) for h in header if h is not None)
            for block in nested:
                if isinstance(block, list):
                    for item in block:
                        yield from _executed_in_order(item.body if isinstance(item, ast.ExceptHandler) else [item])
            continue
        yield statement


def _accelerator_method(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            isinstance(node.func.value, ast.Name) and node.func.value.id == "accelerator":
        return node.func.attr
    return None


def _rank_condition(test: ast.expr) -> bool:
    return any(isinstance(n, ast.Name) and RANK_TEST.fullmatch(n.id) or
               isinstance(n, ast.Attribute) and RANK_TEST.fullmatch(n.attr) for n in ast.walk(test))


def _collectives_under_rank_conditions(tree: ast.Module) -> list[Concern]:
    found: dict[int, Concern] = {}
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
                found[child.lineno] = Concern(  # type: ignore[attr-defined]
                    child.lineno, f"`accelerator.{method}()` runs only under `if {condition}:`, so the processes "  # type: ignore[attr-defined]
                                  "that skip it leave the others waiting (a hang)",
                    f"move `accelerator.{method}()` out of the `if`, where every process runs it")
            stack.extend(ast.iter_child_nodes(child))
    return [found[line] for line in sorted(found)]


def _prepare_after_training(tree: ast.Module, code: str) -> list[Concern]:
    found: list[Concern] = []
    if "accelerator.prepare(" not in code:
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


def _trained_before(earlier: list[ast.stmt], prepared: set[str], line: int) -> Concern | None:
    for statement in earlier:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue  # defined before the prepare, run where it is called
        for node in ast.walk(statement):  # a loop over a loader that is only prepared further down
            source = node.iter if isinstance(node, (ast.For, ast.comprehension)) else None
            while isinstance(source, ast.Call) and source.args and isinstance(source.func, ast.Name) and \
                    source.func.id in {"enumerate", "iter", "tqdm", "zip"}:
                source = source.args[0]
            if isinstance(source, ast.Name) and source.id in prepared:
                where = getattr(node, "lineno", statement.lineno)
                return Concern(line, f"`accelerator.prepare(...)` comes after line {where}, which already iterates "
                                     f"{source.id}: that loop runs on the unprepared loader "
                                     "(every process sees all of its data)",
                               "prepare every loader before the first loop over it")
        nodes = list(ast.walk(statement))
        if not any(_accelerator_method(n) == "backward" for n in nodes):
            continue
        used = {n.id for n in nodes if isinstance(n, ast.Name)} & prepared
        if used:
            return Concern(line, f"`accelerator.prepare(...)` comes after line {statement.lineno}, which already "
                                 f"trains {', '.join(sorted(used))}: that training runs without the distributed "
                                 "wrapper", "prepare the model, optimizer and loaders before the training loop")
    return None


def _prepared_names(statement: ast.AST) -> set[str]:
    if isinstance(statement, ast.Assign) and _accelerator_method(statement.value) == "prepare":
        return {n.id for t in statement.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return set()
