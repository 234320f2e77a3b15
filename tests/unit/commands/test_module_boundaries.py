"""Module boundaries (issue 45): a module uses only what another accelkit module makes public.

Rule: no `from accelkit.x import _name` (absolute or relative, at module level or inside a function) where `_name`
starts with one underscore; a name used across modules is public and named for what it is."""

from __future__ import annotations

import ast
from pathlib import Path

import accelkit

PACKAGE = Path(accelkit.__file__).parent


def private_imports() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level == 0 and not (node.module or "").startswith("accelkit"):
                continue  # another project's private name is that project's business (and rare)
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    where = path.relative_to(PACKAGE.parent).as_posix()
                    found.append(f"{where}:{node.lineno} imports {alias.name} from {'.' * node.level}{node.module}")
    return found


def test_no_module_imports_a_private_name_of_another() -> None:
    assert private_imports() == [], "make the name public (no leading underscore) where it is defined"


CONFIGS = PACKAGE / "configs"


def configs_import_graph() -> dict[str, set[str]]:
    """accelkit/configs module -> the configs modules it imports. Every import statement counts, those inside
    functions too: a function-local import that closes a circle only hides it from the interpreter, not the reader."""
    graph: dict[str, set[str]] = {}
    for path in sorted(CONFIGS.glob("*.py")):
        targets = graph.setdefault(path.stem, set())
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom):
                module = ("accelkit.configs." * (node.level == 1)) + (node.module or "")
                names = [module] if module != "accelkit.configs" else [f"{module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                stem = name.removeprefix("accelkit.configs.").split(".")[0]
                if name.startswith("accelkit.configs.") and (CONFIGS / f"{stem}.py").is_file() and stem != path.stem:
                    targets.add(stem)
    return graph


def import_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of imports in `graph` (its modules, the first repeated at the end), or [] when there is none."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> list[str]:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], module, target] if target in path else [module, target]
            if target not in state and (cycle := visit(target, [*path, module])):
                return cycle
        state[module] = 2
        return []

    for module in sorted(graph):
        if module not in state and (cycle := visit(module, [])):
            return cycle
    return []


def test_the_configs_modules_import_one_another_without_a_circle() -> None:
    assert import_cycle(configs_import_graph()) == []


def test_import_cycle_finds_a_circle() -> None:
    assert import_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert import_cycle({"a": {"b"}, "b": set()}) == []
