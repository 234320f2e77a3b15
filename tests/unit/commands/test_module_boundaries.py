"""Module boundaries (issue 45): no private name crosses modules, no public name is defined in two packages, and
the configs modules import one another without a circle.

Private names: no `from accelkit.x import _name` (absolute or relative, at module level or inside a function);
a name used across modules is public and named for what it is."""

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


# Names every module of a kind defines on purpose, one per module, reached through the module (never imported bare):
PROTOCOL_NAMES = {
    "main": "the entry point of a module run as `python -m accelkit.x.y` (a rank, a node launcher, a worker)",
    "install": "a probe module's hook that puts it in place, called through its module (`steps.install()`)",
}


def public_definitions() -> dict[str, set[str]]:
    """Each public function or class defined at a module's top level -> the modules defining it. Nested definitions,
    assignments and re-exports (`from x import y`) are not definitions; `_private` names are each module's own."""
    defined: dict[str, set[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            definition = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            if definition and not node.name.startswith("_"):
                defined.setdefault(node.name, set()).add(path.relative_to(PACKAGE).as_posix())
    return defined


def package_of(module: str) -> str:
    """accelkit's package a module belongs to: `launch` for launch/cluster/node.py, `accelkit` for cli.py."""
    return module.split("/")[0] if "/" in module else "accelkit"


def test_no_public_name_is_defined_in_two_packages() -> None:
    twice = {name: sorted(modules) for name, modules in public_definitions().items()
             if name not in PROTOCOL_NAMES and len({package_of(m) for m in modules}) > 1}
    assert twice == {}, "one definition per name: import it from its package, or name each for what it does"


def test_the_protocol_names_are_still_defined_in_several_packages() -> None:
    """The allow-list stays honest: each name on it is still one that many modules define."""
    defined = public_definitions()
    assert all(len({package_of(m) for m in defined.get(name, ())}) > 1 for name in PROTOCOL_NAMES)
