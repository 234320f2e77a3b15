"""Package surfaces: a module outside package P imports from P only what P's `__init__` exports (its `__all__`),
never one of P's own modules. The test walks every import of the accelkit package (module level and inside
functions) with `ast`, so a private import anywhere fails it.

CLOSED lists the packages whose surface is already small and whole; a package joins it when nothing outside it
reaches into its modules (issue 20: launch first, the others as their surfaces are made).
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import accelkit

CLOSED = ("accelkit.launch", "accelkit.bench", "accelkit.configs", "accelkit.convert", "accelkit.merge",
          "accelkit.plan", "accelkit.ranks", "accelkit.ranks.probes", "accelkit.rehearsal")
ROOT = Path(accelkit.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, name: str) -> list[tuple[int, str, tuple[str, ...]]]:
    """(line, module, names) of every import in `path` (module `name`); relative imports resolved; `import a.b`
    gives ('a.b', ())."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, ()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found.append((node.lineno, base, tuple(alias.name for alias in node.names)))
    return found


def sources() -> list[tuple[Path, str]]:
    return [(path, module_name(path)) for path in sorted(ROOT.rglob("*.py"))]


def violations(modules: list[tuple[Path, str]], closed: tuple[str, ...] = CLOSED) -> list[str]:
    """Every import in `modules` ((file, module name) pairs) that reaches past a closed package's surface."""
    exported = {package: set(importlib.import_module(package).__all__) for package in closed}
    found = []
    for path, importer in modules:
        for line, module, names in imports(path, importer):
            for package in closed:
                if importer == package or importer.startswith(package + "."):
                    continue  # the package's own modules import each other freely
                where = f"{importer} ({path.name}:{line})"
                if module in closed and module != package:
                    continue  # a closed subpackage has its own surface, checked on its own
                if module.startswith(package + "."):
                    found.append(f"{where} imports {module}, a module of {package}")
                elif module == package:
                    found += [f"{where} imports {name} from {package}, which it does not export"
                              for name in names if name not in exported[package]]
    return found


def test_no_module_outside_a_closed_package_imports_its_private_modules() -> None:
    assert violations(sources()) == []


def test_the_walk_finds_a_private_import(tmp_path: Path) -> None:
    """The detector itself: a module reaching into launch's run.py (as convert's launcher did) and a name launch
    does not export are both found, relative imports too; launch's own modules may import each other."""
    offender = tmp_path / "offender.py"
    offender.write_text("def f():\n    from accelkit.launch.supervisor import _prctl\n"
                        "    from accelkit.launch import ports\nfrom ..launch import stacks\n")
    inside = tmp_path / "inside.py"
    inside.write_text("from accelkit.launch.supervisor import Supervisor\n")
    found = violations([(offender, "accelkit.bench.offender"), (inside, "accelkit.launch.inside")])
    assert sorted(found) == ["accelkit.bench.offender (offender.py:2) imports accelkit.launch.supervisor, a module of "
                             "accelkit.launch",
                             "accelkit.bench.offender (offender.py:3) imports ports from accelkit.launch, which it "
                             "does not export",
                             "accelkit.bench.offender (offender.py:4) imports stacks from accelkit.launch, which it "
                             "does not export"], found


def test_every_export_of_a_closed_package_resolves() -> None:
    for package in CLOSED:
        module = importlib.import_module(package)
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{package}.{name}"


# Names every package may define for the same role: a probe's hook into a rank (`install`, run by
# accelkit.ranks.bootstrap) and a process's entry point (`main`, run as `python -m`).
SHARED_ROLES = {"install", "main"}
# The N-D mesh is still written twice (bench's and plan's `Layout`, one meaning): one type is issue 33's to do.
WRITTEN_TWICE = {"Layout"}


def public_definitions(modules: list[tuple[Path, str]]) -> dict[str, set[str]]:
    """Top-level public class and function name -> the packages (accelkit.X) that define it."""
    found: dict[str, set[str]] = {}
    for path, name in modules:
        package = ".".join(name.split(".")[:2])
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef) and not node.name.startswith("_"):
                found.setdefault(node.name, set()).add(package)
    return found


def test_no_name_means_two_things_across_packages() -> None:
    """A class or function name defined in two packages (an edit plan, a memory plan and tensor byte ranges were
    all `Plan`) must be renamed by its role."""
    clashes = {name: sorted(packages) for name, packages in public_definitions(sources()).items()
               if len(packages) > 1 and name not in SHARED_ROLES | WRITTEN_TWICE}
    assert clashes == {}


def test_the_name_check_finds_a_clash(tmp_path: Path) -> None:
    one, two = tmp_path / "one.py", tmp_path / "two.py"
    one.write_text("class Plan:\n    pass\n\ndef _private():\n    pass\n")
    two.write_text("def Plan():\n    pass\n\ndef _private():\n    pass\n")
    found = public_definitions([(one, "accelkit.convert.one"), (two, "accelkit.merge.two")])
    assert found == {"Plan": {"accelkit.convert", "accelkit.merge"}}


# The faces' exports, all together: a ceiling that only goes down (issue 33's 70; 121 before it, 77 once the unused
# were gone, 76 with plan's typed request and merge's one call, 77 with the ranks' attempt variable; 70 once bench's
# compression run went behind run_bench, a config said its own pipeline variable and file source, the rule check
# and its refusal became one call, and convert's --help kept its backup suffix literal; 71 with merge's reader of a
# ZeRO checkpoint's world size, which launch needs to resume it on another one: issue 42).
MAX_EXPORTS = 71


def faces() -> dict[str, list[str]]:
    found = {}
    for path, name in sources():
        if path.name == "__init__.py" and name != "accelkit":
            module = importlib.import_module(name)
            if hasattr(module, "__all__"):
                found[name] = list(module.__all__)
    return found


def test_every_export_is_imported_outside_its_package() -> None:
    """A name a package's face exports is there for other packages: one nothing outside imports is surface without a
    user (tests import the module that defines it)."""
    importers: dict[tuple[str, str], list[str]] = {}
    for path, importer in sources():
        for _, module, names in imports(path, importer):
            for name in names:
                if not (importer == module or importer.startswith(module + ".")):
                    importers.setdefault((module, name), []).append(importer)
    unused = [f"{package}.{name}" for package, names in faces().items() for name in names
              if (package, name) not in importers]
    assert unused == []
    assert sum(len(names) for names in faces().values()) <= MAX_EXPORTS


# Module names that several packages use for the same role: `api.py` is a command as one call, `probe.py` the code a
# feature runs inside each rank, `report.py` a command's printed report.
SHARED_MODULE_ROLES = {"api.py", "probe.py", "report.py"}
# Left to rename, each with how many modules may still share it: none.
MODULE_NAMES_LEFT: dict[str, int] = {}


def test_module_names_are_unique_but_for_shared_roles() -> None:
    names: dict[str, list[str]] = {}
    for path, name in sources():
        if path.name != "__init__.py":
            names.setdefault(path.name, []).append(name)
    repeated = {file: len(modules) for file, modules in names.items() if len(modules) > 1}
    assert {file: count for file, count in repeated.items() if file not in SHARED_MODULE_ROLES
            and count > MODULE_NAMES_LEFT.get(file, 1)} == {}
    # api.py is the command as one call and nothing else: it defines a run_<command> function
    for path, name in sources():
        if path.name == "api.py":
            functions = {node.name for node in ast.parse(path.read_text(encoding="utf-8")).body
                         if isinstance(node, ast.FunctionDef)}
            assert any(function.startswith("run_") for function in functions), name


def test_test_file_names_are_unique() -> None:
    # tests/ has no __init__.py files: pytest imports each test file by its base name, so two files of one name in
    # different folders stop collection ("import file mismatch") as soon as one worker meets both.
    tests_root = Path(__file__).resolve().parents[2]
    seen: dict[str, list[str]] = {}
    for path in tests_root.rglob("test_*.py"):
        if "data" not in path.relative_to(tests_root).parts:
            seen.setdefault(path.name, []).append(str(path.relative_to(tests_root)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
