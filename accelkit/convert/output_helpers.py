"""Functions of the script's project that only make output: a hand-made progress bar or log line, a run's
bookkeeping files; the call runs on one process.

`from utils import progress_bar` then `progress_bar(i, len(loader), msg)`: the module is not converted, so on N
processes the bar is drawn N times over itself (and `--check` rightly counts the other ranks' lines); minGPT's
`setup_logging(config)` writes `args.txt` and `config.json` from every process at once. A function qualifies only
when reading it proves that output is all it does: it writes through `print`, `sys.stdout` or `sys.stderr`, or into
files it opens for writing in a `with` (`f.write`, `json.dump(x, f)`, `print(..., file=f)`) and folders it makes,
returns nothing, and otherwise only computes (builtins, `time`, `math`, `os.path`, `json.dumps`, string methods,
containers it made itself, module functions and methods of the module's classes that qualify the same way, module
globals that only such functions read, e.g. the bar's last timestamp). Anything else (a file read, a tensor, a
collective, a raise) and it is left alone. Parsed with `ast`, never imported; only the project's files are read,
where the run finds them (neighbours.py).
"""

from __future__ import annotations

import ast
from functools import lru_cache
from pathlib import Path

from accelkit.convert.neighbours import module_file

OUTPUT = {"print", "sys.stdout.write", "sys.stdout.flush", "sys.stderr.write", "sys.stderr.flush"}
HARMLESS = {"len", "int", "float", "str", "bool", "round", "min", "max", "abs", "range", "enumerate", "zip", "format",
            "repr", "sum", "any", "all", "isinstance", "list", "tuple", "dict", "set", "sorted", "reversed",
            "divmod", "json.dumps", "time.time", "time.perf_counter", "time.monotonic", "time.strftime",
            "time.localtime", "datetime.datetime.now", "datetime.timedelta"}
HARMLESS_MODULES = ("math.", "os.path.")
FILE_OUTPUT = {"os.makedirs", "os.mkdir"}
WRITING_MODES = set("wax")
HANDLE_METHODS = {"write", "writelines", "flush"}
READ_ONLY_METHODS = {"items", "keys", "values"}  # a mapping's views: on any object, they read
# methods that read or build strings and containers; mutating ones only on containers the function made itself
READING_METHODS = {"join", "format", "ljust", "rjust", "center", "strip", "rstrip", "lstrip", "split", "replace",
                   "upper", "lower", "startswith", "endswith", "zfill", "items", "keys", "values", "get", "copy"}
FILLING_METHODS = {"append", "extend", "insert", "update", "add"}
REFUSED_NODES = (ast.Yield, ast.YieldFrom, ast.Await, ast.Raise, ast.Try, ast.Assert, ast.AsyncWith,
                 ast.Delete, ast.Import, ast.ImportFrom, ast.Nonlocal, ast.Lambda, ast.FunctionDef,
                 ast.AsyncFunctionDef, ast.ClassDef)
NEW_OBJECTS = {"list", "dict", "set", "tuple", "str", "format", "repr", "sorted", "int", "float", "round"}
FRESH_VALUES = (ast.Constant, ast.List, ast.Dict, ast.Set, ast.Tuple, ast.ListComp, ast.DictComp, ast.SetComp,
                ast.JoinedStr, ast.BinOp, ast.UnaryOp)


def output_only(qualified: str, directory: Path | None) -> tuple[Path, str] | None:
    """(the file, "files" or "terminal") when the project's top-level function `qualified` (`utils.progress_bar`)
    only makes output: "files" when it writes any file (it then runs on the main process), else "terminal" (the
    local main process); None when it does anything else, or is not one of the project's files."""
    module, _, function = qualified.rpartition(".")
    if not module or directory is None:
        return None
    path = module_file(module, directory)  # not a package of the same name further up
    if path is None:
        return None
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    kind = _output_kind(text, function)
    return (path, kind) if kind else None


@lru_cache(maxsize=64)
def _output_kind(text: str, function: str) -> str | None:
    """Keyed by the module's text: a file edited between two conversions is read again."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    reader = _Module(tree)
    node = reader.functions.get(function)
    if node is None or any(isinstance(n, ast.Return) and n.value is not None for n in ast.walk(node)):
        return None  # its result may be used: it does more than make output
    seen: set[str] = set()
    if not reader.qualifies(node, seen) or not (reader.output or reader.files):
        return None
    if not reader.globals_read_only_by(seen):
        return None
    return "files" if reader.files else "terminal"


class _Module:
    """One parsed module: its imports, its top-level functions, and what those do."""

    def __init__(self, tree: ast.Module) -> None:
        self.functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
        self.aliases: dict[str, str] = {}
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:  # `import os.path` binds `os`; `import numpy as np` binds `np`
                    root = alias.name.split(".")[0]
                    self.aliases[alias.asname or root] = alias.name if alias.asname else root
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        self.tree = tree
        self.assigned_globals: set[str] = set()
        self.output = False  # some function reached writes to stdout or stderr
        self.files = False  # ... or writes a file or makes a folder
        self.methods: dict[str, list[ast.FunctionDef]] = {}  # the module's classes' methods, by name
        for node in tree.body:
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef):
                        self.methods.setdefault(item.name, []).append(item)

    def qualified(self, func: ast.expr) -> str | None:
        parts = []
        while isinstance(func, ast.Attribute):
            parts.append(func.attr)
            func = func.value
        if not isinstance(func, ast.Name):
            return None
        root = self.aliases.get(func.id, func.id)
        return ".".join([root, *reversed(parts)])

    def qualifies(self, function: ast.FunctionDef, seen: set[str]) -> bool:
        """Every statement of `function` (and of the module functions it calls) prints, computes, or updates its
        own locals and the module globals it declares."""
        if function.name in seen:
            return True
        seen.add(function.name)
        if function.decorator_list or any(isinstance(n, REFUSED_NODES) for n in ast.walk(function)
                                          if n is not function):
            return False
        declared = {name for n in ast.walk(function) if isinstance(n, ast.Global) for name in n.names}
        fresh = _fresh_locals(function, declared)
        self.assigned_globals |= declared
        handles, opens = _writing_handles(function)
        if handles is None:
            return False  # a `with` that is not a file opened for writing
        for node in ast.walk(function):
            if isinstance(node, ast.Call) and id(node) in opens:
                self.files = True
            elif isinstance(node, ast.Call) and not self._call_allowed(node, fresh, seen, handles):
                return False
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign, ast.For, ast.comprehension)) else []
            for target in targets:
                if not all(_target_allowed(t, fresh, declared) for t in _flatten(target)):
                    return False
        return True

    def _call_allowed(self, call: ast.Call, fresh: set[str], seen: set[str], handles: set[str]) -> bool:
        name = self.qualified(call.func)
        if name in OUTPUT:
            # `print(..., file=f)`: the terminal (sys.stdout / sys.stderr) or a file this function opened for
            # writing; `**kw` may hold anything
            terminal = {"sys.stdout", "sys.stderr"}
            if any(k.arg is None for k in call.keywords):
                return False
            target = next((k.value for k in call.keywords if k.arg == "file"), None)
            if target is None or self.qualified(target) in terminal:
                self.output = True
                return True
            self.files = isinstance(target, ast.Name) and target.id in handles
            return self.files
        if name in FILE_OUTPUT or (name == "json.dump" and _writes_to_handle(call, handles)):
            self.files = True
            return True
        if name in HARMLESS or (name and name.startswith(HARMLESS_MODULES)):
            return True
        if isinstance(call.func, ast.Name) and call.func.id in self.functions:
            return self.qualifies(self.functions[call.func.id], seen)
        if isinstance(call.func, ast.Attribute):
            owner, method = call.func.value, call.func.attr
            if isinstance(owner, ast.Name) and owner.id in handles and method in HANDLE_METHODS:
                self.files = True
                return True
            if isinstance(owner, ast.Constant) and isinstance(owner.value, str) and method in READING_METHODS:
                return True  # ' | '.join(parts), '{}'.format(x)
            if isinstance(owner, ast.Name) and owner.id in fresh and method in READING_METHODS | FILLING_METHODS:
                return True
            if method in READ_ONLY_METHODS:
                return True
            return self._pure_method(method, seen)
        return False

    def _pure_method(self, method: str, seen: set[str]) -> bool:
        """`config.to_dict()`: every method of that name in the module's classes only computes (it may return)."""
        found = self.methods.get(method)
        if not found:
            return False
        output, files = self.output, self.files
        pure = all(self.qualifies(node, seen) for node in found)
        if (self.output, self.files) != (output, files):
            return False  # it makes output of its own: left alone (it could run anywhere)
        return pure

    def globals_read_only_by(self, functions: set[str]) -> bool:
        """The globals the printing functions rebind (a timestamp, a counter) are read by no other function of the
        module: on the other processes, where the calls no longer run, nothing else sees them differ."""
        for node in self.tree.body:
            if isinstance(node, ast.FunctionDef) and node.name in functions or \
                    not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            if any(isinstance(n, ast.Name) and n.id in self.assigned_globals for n in ast.walk(node)):
                return False
        return True


def _writing_handles(function: ast.FunctionDef) -> tuple[set[str] | None, set[int]]:
    """The names bound by `with open(path, "w") as f:` in `function` and those `open` calls; (None, ...) when a
    `with` holds anything else (a lock, a file opened for reading, a context of the caller's)."""
    handles: set[str] = set()
    opens: set[int] = set()
    for node in ast.walk(function):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call = item.context_expr
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "open" and
                    isinstance(item.optional_vars, ast.Name) and _writing_mode(call)):
                return None, opens
            handles.add(item.optional_vars.id)
            opens.add(id(call))
    return handles, opens


def _writing_mode(call: ast.Call) -> bool:
    mode = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and bool(WRITING_MODES & set(mode.value)) \
        and "+" not in mode.value


def _writes_to_handle(call: ast.Call, handles: set[str]) -> bool:
    """`json.dump(obj, f)` with `f` a file the function opened for writing."""
    target = call.args[1] if len(call.args) > 1 else next((k.value for k in call.keywords if k.arg == "fp"), None)
    return isinstance(target, ast.Name) and target.id in handles


def _fresh_locals(function: ast.FunctionDef, declared: set[str]) -> set[str]:
    """Locals every binding of which is a new value (a literal, a string, arithmetic, a call's result): a method
    that fills one changes nothing the caller holds. A parameter is never fresh."""
    bound: dict[str, bool] = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                for t in _flatten(target):
                    if isinstance(t, ast.Name):
                        new = _new_value(node.value) and len(node.targets) == 1 and isinstance(target, ast.Name)
                        bound[t.id] = bound.get(t.id, True) and new
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            bound.setdefault(node.target.id, True)
        elif isinstance(node, (ast.For, ast.comprehension)):
            for t in _flatten(node.target):
                if isinstance(t, ast.Name):
                    bound[t.id] = False  # an element of something else
    arguments = function.args
    params = {a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]}
    params |= {a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None}
    return {name for name, new in bound.items() if new and name not in params and name not in declared}


def _new_value(value: ast.expr) -> bool:
    """A value made on the spot (a literal, arithmetic, `list(...)`, `' '.join(...)`), never an object someone else
    holds (a parameter, a global, whatever a function returns)."""
    if isinstance(value, FRESH_VALUES):
        return True
    if not isinstance(value, ast.Call):
        return False
    func = value.func
    if isinstance(func, ast.Name):
        return func.id in NEW_OBJECTS
    return isinstance(func, ast.Attribute) and isinstance(func.value, ast.Constant) and func.attr in READING_METHODS


def _flatten(target: ast.expr) -> list[ast.expr]:
    if isinstance(target, (ast.Tuple, ast.List)):
        return [t for element in target.elts for t in _flatten(element)]
    if isinstance(target, ast.Starred):
        return _flatten(target.value)
    return [target]


def _target_allowed(target: ast.expr, fresh: set[str], declared: set[str]) -> bool:
    """A local name, a global the function declares, or an item of a container the function made itself."""
    if isinstance(target, ast.Name):
        return True
    root = target
    while isinstance(root, (ast.Subscript, ast.Attribute)):
        root = root.value
    return isinstance(root, ast.Name) and root.id in fresh and isinstance(target, ast.Subscript)


__all__ = ["output_only"]
