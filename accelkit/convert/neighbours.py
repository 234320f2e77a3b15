"""The script's own modules beside it: is the imported code that trains a model already converted?

A script that hands its model to `Trainer(...)` from a file of the same project trains nothing itself; converted
alone it would train every process's own copy. Once that file is converted (it imports Accelerate and calls
`prepare`), the model is prepared there, on every process, and the script needs nothing more. The project's own
files count (`trainlib` -> `trainlib.py` or `trainlib/__init__.py`, `pkg.mod` -> `pkg/mod.py`), looked up where the
script's run finds them: its folder, the folders on $PYTHONPATH, and the root of the project it sits in (a folder
above it with setup.py, setup.cfg or pyproject.toml: `pip install -e .` puts that on the path; minGPT's
`projects/chargpt/chargpt.py` imports `mingpt.trainer` from there). A package installed in site-packages is never
read. Parsed with `ast`, never imported.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

PROJECT_MARKERS = ("setup.py", "setup.cfg", "pyproject.toml")


def import_roots(directory: Path) -> list[Path]:
    """Where the script's run looks for the project's modules: its folder, $PYTHONPATH, its project's root."""
    roots = [directory]
    roots += [Path(entry) for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    root = _project_root(directory)
    return roots + [root] if root is not None else roots


def _project_root(directory: Path) -> Path | None:
    """The nearest folder above `directory` with a project marker."""
    return next((parent for parent in directory.resolve().parents
                 if any((parent / marker).is_file() for marker in PROJECT_MARKERS)), None)


def _find(qualified: str, directory: Path) -> tuple[Path, bool] | None:
    """(the file, whether it is the module `qualified` itself rather than a module or package above it)."""
    parts = qualified.split(".")
    for root in import_roots(directory):
        for end in range(len(parts), 0, -1):
            base = root.joinpath(*parts[:end])
            for candidate in (base.with_name(base.name + ".py"), base / "__init__.py"):
                if candidate.is_file():
                    return candidate, end == len(parts)
    return None


def defining_file(qualified: str, directory: Path | None) -> Path | None:
    """The project file that defines `qualified` (a module, or a name in one: `trainlib.Trainer`), found from the
    script's `directory` as its run would find it."""
    found = _find(qualified, directory) if directory is not None else None
    return found[0] if found else None


def module_file(module: str, directory: Path | None) -> Path | None:
    """The project file of the module `module` itself (`tools.console` -> tools/console.py); None when only a
    module or package above it is found (`tools.py`), or nothing."""
    found = _find(module, directory) if directory is not None else None
    return found[0] if found and found[1] else None


def prepares_itself(path: Path) -> bool:
    """The file imports Accelerate and calls `<something>.prepare(...)`: it was converted (or written for it)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    imports = prepares = False
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom | ast.Import):
            modules = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            imports = imports or any(m.split(".")[0] == "accelerate" for m in modules)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "prepare":
            prepares = True
    return imports and prepares


def converted_neighbour(qualified_names: set[str], directory: Path | None) -> Path | None:
    """The already-converted local file one of `qualified_names` (a call's) comes from, or None."""
    for name in sorted(qualified_names):
        found = defining_file(name, directory)
        if found is not None and prepares_itself(found):
            return found
    return None
