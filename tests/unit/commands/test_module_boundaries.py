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
