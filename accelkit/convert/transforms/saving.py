"""Output and wrapped-model access: `torch.save` -> main-process `accelerator.save` after `wait_for_everyone()`,
`print` -> `accelerator.print`, and model attributes that a DDP/FSDP wrapper hides -> `unwrap_model(model)`."""

from __future__ import annotations

import re
import weakref

import libcst as cst

from accelkit.convert.analysis import Facts, bindings, inside_class
from accelkit.convert.context import Context, accel, accel_call, dotted, walk
from accelkit.convert.edits import EditPlan
from accelkit.convert.output_helpers import output_only

# nn.Module API that works the same on the wrapper DDP/FSDP returns (everything else needs the unwrapped model)
WRAPPER_SAFE = {
    "parameters", "named_parameters", "buffers", "named_buffers", "children", "named_children", "modules",
    "named_modules", "train", "eval", "zero_grad", "requires_grad_", "forward", "training", "apply", "to", "cuda",
    "cpu", "float", "half", "double", "bfloat16", "type", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook",
    "no_sync",  # the wrapper's own (DDP), rewritten to accelerator.no_sync(model) by transforms/distributed.py
    "require_backward_grad_sync",  # nanoGPT's no_sync: an attribute of the DDP wrapper, set on it
}


FILE_WRITERS = {"torchvision.utils.save_image", "matplotlib.pyplot.savefig", "numpy.save", "numpy.savez",
                "numpy.savez_compressed", "numpy.savetxt", "pickle.dump", "json.dump", "yaml.dump", "yaml.safe_dump",
                "imageio.imwrite", "imageio.imsave", "cv2.imwrite", "matplotlib.pyplot.imsave",
                "safetensors.torch.save_file", "torchaudio.save", "scipy.io.savemat"}
WRITING_METHODS = {"savefig", "to_csv", "to_json", "to_parquet", "write_text", "write_bytes", "save_pretrained"}
PROGRESS = {"tqdm.tqdm", "tqdm.auto.tqdm", "tqdm.notebook.tqdm", "tqdm.std.tqdm", "tqdm.trange", "tqdm.auto.trange"}
RANK_WORDS = ("main_process", "rank", "is_master", "local_main", "master_process")
MAIN_ONLY = "only the main process writes it: N processes writing one file race and may leave it corrupt"


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    _saves(ctx, facts, plan)
    _file_writes(ctx, facts, plan)
    _directories(ctx, plan)
    _progress_bars(ctx, plan)
    _stream_writes(ctx, plan)
    _output_helper_calls(ctx, plan)
    _downloads(ctx, plan)
    _prints(ctx, facts, plan)
    _state_dicts(ctx, facts, plan)
    _unwrap(ctx, facts, plan)


def _saves(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    models = facts.of_kind("model")
    downloaded = {name for statement in _download_statements(ctx) for name in _called_names(ctx, statement)}
    for call in ctx.of_type(cst.Call):
        if "torch.save" not in ctx.qnames(call):
            continue
        plan.edit(call, lambda u: u.with_changes(func=accel("save")))
        statement = ctx.statement(call)
        # `with open(path, "wb") as f: torch.save(model, f)`: the `with` becomes main-process only (see
        # _file_writes), so the barriers go around it, never inside it
        statement = _writing_with(ctx, call) or statement
        barriers = statement is not None and not _guarded(ctx, call) and ctx.suite_of(statement) is not None \
            and not _runs_under_main_process_first(ctx, call, downloaded)
        branch = _per_process_branch(ctx, facts, statement) if barriers else None
        caller = _caller_branch(ctx, facts, call) if barriers and branch is None else None
        if caller is not None:
            # `if self.local_rank == 0 and epoch % save_every == 0: self._save_snapshot(epoch)` (the DDP tutorials'
            # Trainer): the function holding the save runs on some processes only; a barrier in it hangs
            function, test = caller
            plan.report.change(ctx.line(call), "`torch.save(...)` -> `accelerator.save(...)` (no barrier: "
                                               f"`{function}` is called under `if {test}:`)",
                               "only the main process writes the file; the processes that skip that `if` would "
                               "never reach a barrier in it (a hang)")
        elif branch is not None:
            # `if val_loss < best: save(...)`: each process decides with its own value; a barrier there would
            # leave the processes that skip the branch waiting (a hang). accelerator.save writes on the main
            # process only, and needs no barrier to be right.
            plan.report.change(ctx.line(call), "`torch.save(...)` -> `accelerator.save(...)` (no barrier: it runs "
                                               f"under `if {ctx.code(branch.test)}:`)",
                               "only the main process writes the file; the processes may decide the `if` "
                               "differently (their own losses), so a barrier there could hang")
        elif barriers:
            # (a barrier inside `if rank == 0:` would wait forever for the processes that skip it)
            plan.insert_before(statement, cst.SimpleStatementLine([cst.Expr(accel_call("wait_for_everyone"))]))
            plan.insert_after(statement, cst.SimpleStatementLine([cst.Expr(accel_call("wait_for_everyone"))]))
            plan.report.change(ctx.line(call), "`torch.save(...)` -> `accelerator.save(...)` between two "
                                               "`accelerator.wait_for_everyone()`",
                               "every process finishes its step before the main process writes the file, and none "
                               "reads it (or moves on) before it is written")
        else:
            plan.report.change(ctx.line(call), "`torch.save(...)` -> `accelerator.save(...)`",
                               "only the main process writes the file")
        if branch is not None and _caller_branch(ctx, facts, call) is None:
            _barrier_before_reading_back(ctx, plan, call, statement)
        what = ctx.code(call.args[0].value) if call.args else "?"
        if call.args and dotted(call.args[0].value) in models:
            # torch.save(model, path) pickles the whole module: the DDP/FSDP wrapper must not end up in the file
            plan.edit(call.args[0].value, lambda u: accel_call("unwrap_model", u))
            plan.report.change(ctx.line(call), f"`{what}` -> `accelerator.unwrap_model({what})` in the save",
                               "the file must hold the model itself, not the DDP/FSDP wrapper the process trains")
            what = f"unwrapped `{what}`"
        plan.report.found_item("file write", ctx.code(call.args[1].value) if len(call.args) > 1 else "",
                               ctx.line(call), f"{what}: written by the main process only (accelerator.save), "
                                               "after every process finished its step")


def _saved_path(ctx: Context, call: cst.Call) -> str | None:
    """The code of the path `torch.save` writes: its second argument, or the path of the `with open(PATH, "wb")`
    whose handle it writes to."""
    if len(call.args) < 2:
        return None
    target = call.args[1].value
    writer = _writing_with(ctx, call)
    if writer is not None and isinstance(target, cst.Name):
        for item in writer.items:
            if item.asname is not None and dotted(item.asname.name) == target.value and \
                    isinstance(item.item, cst.Call) and item.item.args:
                return ctx.code(item.item.args[0].value)
    return ctx.code(target)


def _reads_of(ctx: Context, path: str) -> list[cst.Call]:
    """`torch.load(PATH, ...)` and `open(PATH)` / `open(PATH, "rb")` of the same path expression."""
    found = []
    for read in ctx.of_type(cst.Call):
        if not read.args or ctx.code(read.args[0].value) != path:
            continue
        if "torch.load" in ctx.qnames(read) or (ctx.code(read.func) == "open" and not _opens_for_writing(ctx, read)):
            found.append(read)
    return found


def _barrier_before_reading_back(ctx: Context, plan: EditPlan, call: cst.Call, statement: cst.CSTNode) -> None:
    """A save with no barrier (under a per-process branch, in code every process runs) whose file every process
    reads back later in the same function (the best checkpoint loaded for the test): the others would read it
    before the main process wrote it (a missing or half written file). One barrier goes before the read, at the
    level of the function (or module) body, outside any branch."""
    path = _saved_path(ctx, call)
    if path is None:
        return
    suite = ctx.scope_body(statement)
    body = list(suite.body)  # type: ignore[attr-defined]
    top = ctx.top_statement_in(statement, suite)
    if top not in body:
        return
    for read in _reads_of(ctx, path):
        before = ctx.top_statement_in(read, suite)
        if before not in body or body.index(before) <= body.index(top) or \
                ctx.function(read) is not ctx.function(call):
            continue
        barrier = cst.SimpleStatementLine([cst.Expr(accel_call("wait_for_everyone"))], leading_lines=[
            cst.EmptyLine(comment=cst.Comment("# the main process has written the file before any process reads it"))])
        plan.insert_before(before, barrier)
        plan.report.change(ctx.line(before), f"added `accelerator.wait_for_everyone()` before `{path}` is read "
                                             f"back (line {ctx.line(read)})",
                           "the main process alone writes it (line "
                           f"{ctx.line(call)}); without the barrier the other processes could read it first")
        return


CONFIG_ROOTS = {"args", "opt", "opts", "cfg", "config", "conf", "hparams", "hp", "params", "flags", "FLAGS",
                "options", "self"}
UNIFORM_CALLS = {"len", "isinstance", "hasattr", "getattr", "int", "float", "bool", "str", "range"}


def _per_process_branch(ctx: Context, facts: Facts, statement: cst.CSTNode) -> cst.If | None:
    """The innermost `if` around `statement` whose test each process might decide differently (its own loss or
    metric); `None` when every `if` up to the function is decided alike everywhere (flags, loop counters,
    constants). The `__main__` guard is no branch."""
    for ancestor in ctx.ancestors(statement):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
            return None
        if isinstance(ancestor, cst.If) and ctx.main_guard(statement) is not ancestor and \
                not _uniform(ctx, ancestor.test, statement):
            return ancestor
    return None


def _uniform(ctx: Context, test: cst.BaseExpression, where: cst.CSTNode) -> bool:
    """A test every process decides alike: made of configuration (`args.save_model`, `cfg.x`), counters of
    enclosing `for ... in range(...)` loops or counted `+= 1`, module constants bound to literals, and literals."""
    counters: set[str] = set()
    for loop in ctx.ancestors(where):
        if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call):
            target = loop.target
            if ctx.code(loop.iter.func) == "enumerate" and isinstance(target, cst.Tuple) and target.elements:
                target = target.elements[0].value  # the index, not the batch
            elif ctx.code(loop.iter.func) != "range":
                continue
            counters |= {n.value for n in walk(target) if isinstance(n, cst.Name)}
    for node in walk(test):
        if isinstance(node, cst.Call):
            if ctx.code(node.func) not in UNIFORM_CALLS:
                return False
        elif isinstance(node, cst.Attribute):
            root = node
            while isinstance(root, cst.Attribute):
                root = root.value
            if not (isinstance(root, cst.Name) and root.value in CONFIG_ROOTS):
                return False
        elif isinstance(node, cst.Name):
            parent = ctx.parent(node)
            if isinstance(parent, cst.Attribute) or node.value in {"True", "False", "None"} or \
                    node.value in UNIFORM_CALLS or node.value in counters or node.value in CONFIG_ROOTS:
                continue
            if not _counter_or_constant(ctx, node.value):
                return False
    return True


def _counter_or_constant(ctx: Context, name: str) -> bool:
    """Every binding of `name` is a literal or a `+= literal` step (an iteration counter)."""
    seen = False
    for node in ctx.of_type(cst.Assign, cst.AugAssign, cst.AnnAssign):
        if isinstance(node, cst.AugAssign):
            if dotted(node.target) == name:
                seen = True
                if not isinstance(node.value, (cst.Integer, cst.Float)):
                    return False
            continue
        for key, value, _ in bindings(node):
            if key == name:
                seen = True
                if not isinstance(value, (cst.Integer, cst.Float, cst.SimpleString, cst.Name)) or \
                        (isinstance(value, cst.Name) and value.value not in {"True", "False", "None"}):
                    return False
    return seen


def _caller_branch(ctx: Context, facts: Facts, node: cst.CSTNode, depth: int = 3) -> tuple[str, str] | None:
    """(function, test) when the function around `node` is called (`name(...)`, `self.name(...)`), directly or
    through up to `depth` functions, from under a rank guard or an `if` the processes may decide differently: its
    body runs on some processes only."""
    function = ctx.function(node)
    if function is None or depth == 0:
        return None
    name = function.name.value
    for site in _calls_named(ctx, name):
        if any(a is function for a in ctx.ancestors(site)):
            continue  # a recursive call
        statement = ctx.statement(site) or site
        for ancestor in ctx.ancestors(site):
            if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module)):
                break
            if isinstance(ancestor, cst.If) and (_rank_test(ctx, ancestor.test)
                                                 or _per_process_branch(ctx, facts, statement) is ancestor):
                return name, ctx.code(ancestor.test)
        outer = _caller_branch(ctx, facts, site, depth - 1)
        if outer is not None:
            return outer
    return None


def _state_dicts(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    """`model.state_dict()` (or `model.module.state_dict()`) read under a rank guard: under FSDP and DeepSpeed
    ZeRO-3 the full state dict is gathered from every process, so the process that asks alone waits forever. The
    gathering `accelerator.get_state_dict(model)` runs on every process right before the guard; the guard keeps
    the file write."""
    models = facts.of_kind("model")
    hoisted: dict[tuple[int, str], str] = {}
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "state_dict" and not call.args):
            continue
        receiver = func.value
        if isinstance(receiver, cst.Attribute) and receiver.attr.value == "module":
            receiver = receiver.value
        model = dotted(receiver)
        if model not in models or inside_class(ctx, call, facts.model_classes):
            continue
        guard = _outermost_guard(ctx, call)
        if guard is None:
            continue
        name = f"{model.rsplit('.', 1)[-1]}_state_dict"
        key = (id(guard), model)
        if key not in hoisted:
            hoisted[key] = name
            plan.insert_before(guard, cst.parse_statement(f"{name} = accelerator.get_state_dict({model})\n"))
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` under `if {ctx.code(guard.test)}:` -> "
                                               f"`{name} = accelerator.get_state_dict({model})` before it, on every "
                                               "process", "under FSDP/DeepSpeed the full state dict is gathered from "
                                                          "every process: asked for by one process alone, it hangs "
                                                          "(DeepSpeed ZeRO-3: launch with --zero3-save-16bit-model)")
        plan.edit(call, lambda u, n=name: cst.Name(n))


def _outermost_guard(ctx: Context, node: cst.CSTNode) -> cst.If | None:
    found = None
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)):
            break
        if isinstance(ancestor, cst.If) and any(w in ctx.code(ancestor.test) for w in RANK_WORDS) \
                and ctx.suite_of(ancestor) is not None:
            found = ancestor
    return found


def _writes_file(ctx: Context, call: cst.Call) -> bool:
    if ctx.qnames(call) & FILE_WRITERS:
        return True
    func = call.func
    if isinstance(func, cst.Attribute):
        if func.attr.value in WRITING_METHODS:
            return True
        if func.attr.value == "save" and not any(q.startswith(("torch.", "accelerate.")) for q in ctx.qnames(call)) \
                and (isinstance(func.value, cst.Call) or "im" in (dotted(func.value) or "").lower()):
            return True  # `Image.fromarray(a).save(path)`, `img.save(path)`
        if func.attr.value == "write" and isinstance(func.value, cst.Call) and _opens_for_writing(ctx, func.value):
            return True
    return False


def _opens_for_writing(ctx: Context, call: cst.CSTNode) -> bool:
    if not (isinstance(call, cst.Call) and ("builtins.open" in ctx.qnames(call) or
                                            (isinstance(call.func, cst.Attribute) and call.func.attr.value == "open"))):
        return False
    modes = [a.value for a in call.args[1:2] if a.keyword is None] + \
        [a.value for a in call.args if a.keyword is not None and a.keyword.value == "mode"]
    return any(isinstance(m, cst.SimpleString) and set(str(m.evaluated_value)) & set("wax+") for m in modes)


def _writing_with(ctx: Context, node: cst.CSTNode) -> cst.With | None:
    """The outermost `with open(..., "w")` around `node`, if any."""
    found = None
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, cst.FunctionDef):
            break
        if isinstance(ancestor, cst.With) and any(_opens_for_writing(ctx, item.item) for item in ancestor.items):
            found = ancestor
    return found


def _guarded(ctx: Context, node: cst.CSTNode) -> bool:
    """Already inside `if accelerator.is_main_process:`, `if rank == 0:`, `if self.gpu_id == 0:` or similar."""
    return any(isinstance(a, cst.If) and _rank_test(ctx, a.test) for a in ctx.ancestors(node))


RANK_READ = re.compile(r"""LOCAL_RANK|["']RANK["']|SLURM_PROCID|SLURM_LOCALID|get_rank|get_local_rank|process_index""")


# per parsed script, computed once: the names bound to the rank, the script's calls by the name they call
_RANK_BOUND: weakref.WeakKeyDictionary[Context, set[str]] = weakref.WeakKeyDictionary()
_CALLS_BY_NAME: weakref.WeakKeyDictionary[Context, dict[str, list[cst.Call]]] = weakref.WeakKeyDictionary()


def _rank_test(ctx: Context, test: cst.BaseExpression) -> bool:
    """The test names the rank (`rank == 0`, `is_main_process`), or reads a name bound to it: `self.gpu_id == 0`
    with `self.gpu_id = int(os.environ["LOCAL_RANK"])` (the DDP tutorials' Trainer)."""
    if any(w in ctx.code(test) for w in RANK_WORDS):
        return True
    bound = _RANK_BOUND.get(ctx)
    if bound is None:
        bound = _RANK_BOUND[ctx] = {key for node in ctx.of_type(cst.Assign, cst.AnnAssign)
                                    for key, value, _ in bindings(node)
                                    if value is not None and RANK_READ.search(ctx.code(value))}
    return bool(bound) and any(dotted(n) in bound for n in walk(test) if isinstance(n, (cst.Name, cst.Attribute)))


def _calls_named(ctx: Context, name: str) -> list[cst.Call]:
    """`name(...)` and `self.name(...)` / `cls.name(...)` calls of the script."""
    calls = _CALLS_BY_NAME.get(ctx)
    if calls is None:
        calls = _CALLS_BY_NAME[ctx] = {}
        for call in ctx.of_type(cst.Call):
            func = call.func
            if isinstance(func, cst.Name):
                calls.setdefault(func.value, []).append(call)
            elif isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and \
                    func.value.value in {"self", "cls"}:
                calls.setdefault(func.attr.value, []).append(call)
    return calls.get(name, [])


def _file_writes(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    wrapped: set[int] = set()
    for node in ctx.of_type(cst.Call, cst.With):
        if isinstance(node, cst.With):
            if not any(_opens_for_writing(ctx, item.item) for item in node.items):
                continue
            statement: cst.CSTNode | None = node
            what = ctx.code(node.items[0].item)
        else:
            if not _writes_file(ctx, node) or any(isinstance(a, cst.With) and id(a) in wrapped
                                                  for a in ctx.ancestors(node)):
                continue
            statement = ctx.statement(node)
            what = ctx.code(node)
        if statement is None or id(statement) in wrapped or _guarded(ctx, node) or \
                ctx.suite_of(statement) is None:  # type: ignore[arg-type]
            continue
        wrapped.add(id(statement))
        plan.edit(statement, lambda u: cst.If(test=accel("is_main_process"), body=cst.IndentedBlock(
            body=[u.with_changes(leading_lines=[])]), leading_lines=u.leading_lines))
        plan.report.change(ctx.line(node), f"`{what}` now runs on the main process only "
                                           "(`if accelerator.is_main_process:`)", MAIN_ONLY)
        plan.report.found_item("file write", what, ctx.line(node), "main process only")


def _directories(ctx: Context, plan: EditPlan) -> None:
    """`os.mkdir(d)` on N processes: all but one fail with FileExistsError. `exist_ok=True` makes it a no-op."""
    for call in ctx.of_type(cst.Call):
        names = ctx.qnames(call)
        method = call.func.attr.value if isinstance(call.func, cst.Attribute) else ""
        has_ok = any(a.keyword is not None and a.keyword.value == "exist_ok" for a in call.args)
        if has_ok or not call.args and "os.mkdir" in names:
            continue
        ok = cst.Arg(value=cst.Name("True"), keyword=cst.Name("exist_ok"),
                     equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                           whitespace_after=cst.SimpleWhitespace("")))
        if "os.mkdir" in names:
            plan.edit(call, lambda u, ok=ok: u.with_changes(func=cst.parse_expression("os.makedirs"),
                                                            args=[*u.args[:1], ok]), uses_accelerator=False)
        elif "os.makedirs" in names or (method == "mkdir" and not names & {"os.mkdir"}):
            plan.edit(call, lambda u, ok=ok: u.with_changes(args=[*u.args, ok] if not u.args else
                                                            [*u.args[:-1], u.args[-1].with_changes(
                                                                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(
                                                                    " "))), ok]), uses_accelerator=False)
        else:
            continue
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` now passes `exist_ok=True`",
                           "every process creates the folder: without exist_ok all but the first fail with "
                           "FileExistsError")


def _progress_bars(ctx: Context, plan: EditPlan) -> None:
    for call in ctx.of_type(cst.Call):
        if not ctx.qnames(call) & PROGRESS:
            continue
        existing = next((a for a in call.args if a.keyword is not None and a.keyword.value == "disable"), None)
        if existing is None:
            arg = cst.Arg(value=cst.parse_expression("not accelerator.is_local_main_process"),
                          keyword=cst.Name("disable"), equal=cst.AssignEqual(
                              whitespace_before=cst.SimpleWhitespace(""), whitespace_after=cst.SimpleWhitespace("")))
            plan.edit(call, lambda u, a=arg: u.with_changes(args=[*u.args[:-1], u.args[-1].with_changes(
                comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))] + [a] if u.args else [a]))
        else:
            plan.edit(existing, lambda u: u.with_changes(value=cst.parse_expression(
                f"({cst.Module([]).code_for_node(u.value)}) or not accelerator.is_local_main_process")))
        plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}(...)` gets "
                                           "`disable=not accelerator.is_local_main_process`",
                           "one progress bar per machine, not one per process drawn over each other")


def _stream_writes(ctx: Context, plan: EditPlan) -> None:
    """A hand-made progress bar (`sys.stdout.write("\\r...")`) is drawn by every process over each other."""
    for call in ctx.of_type(cst.Call):
        if not ctx.qnames(call) & {"sys.stdout.write", "sys.stderr.write"}:
            continue
        statement = ctx.statement(call)
        if statement is None or _guarded(ctx, call) or ctx.suite_of(statement) is None:
            continue
        plan.edit(statement, lambda u: cst.If(test=accel("is_local_main_process"), body=cst.IndentedBlock(
            body=[u.with_changes(leading_lines=[])]), leading_lines=u.leading_lines))
        plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}(...)` now runs on the local main process only",
                           "a progress line written by N processes is drawn N times over itself")


# what the arguments of a call made on one process may compute: nothing another process waits for (a collective)
QUIET_CALLS = {"len", "int", "float", "str", "round", "min", "max", "abs", "sum", "format", "repr"}
QUIET_METHODS = {"item", "format", "join", "mean", "sum", "size", "numel", "tolist", "detach", "cpu", "get_last_lr",
                 "keys", "values", "items"}  # not `get`: a queue's blocks


def _output_helper_calls(ctx: Context, plan: EditPlan) -> None:
    """`progress_bar(i, len(loader), msg)` from the script's own `utils.py`, a function that only prints, or
    `setup_logging(config)`, one that only writes bookkeeping files (output_helpers.py): that module is not
    converted, so the call itself runs on one process: the local main one for the terminal, the main one for
    files."""
    if ctx.directory is None:  # the script's folder is unknown: no module of its own to read
        return
    for call in ctx.of_type(cst.Call):
        statement = ctx.statement(call)
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1 or \
                not isinstance(statement.body[0], cst.Expr) or statement.body[0].value is not call:
            continue  # only a call whose result is not used
        found = [f for f in (output_only(q, ctx.directory) for q in sorted(ctx.qnames(call))
                             if not q.startswith("builtins.")) if f is not None]
        if not found or _guarded(ctx, call) or ctx.suite_of(statement) is None or not _quiet_arguments(ctx, call):
            continue
        path, kind = found[0]
        gate, who = ("is_main_process", "the main process") if kind == "files" else \
            ("is_local_main_process", "the local main process")
        plan.edit(statement, lambda u, gate=gate: cst.If(test=accel(gate), body=cst.IndentedBlock(
            body=[u.with_changes(leading_lines=[])]), leading_lines=u.leading_lines))
        plan.gated_output.append(statement)
        why = ("it only writes files and folders (read in {}, which is not converted): N processes would write the "
               "same files at once") if kind == "files" else \
            ("it only prints (it writes to the terminal and returns nothing, read in {}, which is not converted): "
             "drawn by N processes, its output comes N times")
        plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}(...)` now runs on {who} only",
                           why.format(path.name))


def _quiet_arguments(ctx: Context, call: cst.Call) -> bool:
    """The call's arguments compute nothing the other processes need (no collective, no iterator advanced)."""
    for node in ctx.descendants(call):
        if type(node) is not cst.Call or node is call:
            continue
        func = node.func
        if isinstance(func, cst.Name) and func.value in QUIET_CALLS:
            continue
        if isinstance(func, cst.Attribute) and func.attr.value in QUIET_METHODS:
            continue
        return False
    return True


FETCHES = {"shutil.unpack_archive", "urllib.request.urlretrieve", "torchvision.datasets.utils.download_url",
           "torchvision.datasets.utils.download_and_extract_archive", "torchvision.datasets.utils.extract_archive",
           "torch.hub.download_url_to_file"}


def _fetches(ctx: Context, call: cst.Call) -> bool:
    """A call that downloads or unpacks into a shared folder: `download=True`, `tar.extractall(d)`, ..."""
    if any(a.keyword is not None and a.keyword.value == "download" and ctx.code(a.value) != "False"
           for a in call.args):
        return True
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "extractall":
        return True
    return bool(ctx.qnames(call) & FETCHES)


def _whole_fetch(ctx: Context, statement: cst.CSTNode) -> cst.CSTNode:
    """The statement to run under main_process_first: the fetch with the `with tarfile.open(...)` around it and
    the `if not os.path.exists(d):` that decides it (each process may decide it differently: the main process
    may have unpacked already; a barrier inside such an `if` hangs)."""
    for ancestor in ctx.ancestors(statement):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef, cst.Module, cst.For, cst.While)):
            break
        decides = isinstance(ancestor, cst.If) and ctx.main_guard(statement) is not ancestor and \
            not _uniform(ctx, ancestor.test, statement)
        if (isinstance(ancestor, cst.With) or decides) and ctx.suite_of(ancestor) is not None:
            statement = ancestor
    return statement


def _download_statements(ctx: Context) -> list[cst.BaseStatement]:
    """Statements that download or unpack (torchvision's `download=True` and look-alikes, archives)."""
    found: list[cst.BaseStatement] = []
    for call in ctx.of_type(cst.Call):
        if not _fetches(ctx, call):
            continue
        statement = ctx.statement(call)
        statement = _whole_fetch(ctx, statement) if statement is not None else None
        if statement is None or statement in found or ctx.suite_of(statement) is None or \
                any(isinstance(a, cst.With) and "main_process_first" in ctx.code(a.items[0].item)
                    for a in ctx.ancestors(call)):
            continue
        found.append(statement)
    return found


def _called_names(ctx: Context, statement: cst.CSTNode) -> set[str]:
    return {dotted(c.func) or "" for c in ctx.descendants(statement) if type(c) is cst.Call}


def _runs_under_main_process_first(ctx: Context, node: cst.CSTNode, downloaded: set[str]) -> bool:
    """`node` is in a function (or a class's method) that a download statement calls: under main_process_first the
    main process runs it alone first, so a barrier there would wait for processes still outside."""
    for ancestor in ctx.ancestors(node):
        if isinstance(ancestor, (cst.FunctionDef, cst.ClassDef)) and ancestor.name.value in downloaded:
            return True
    return False


def _downloads(ctx: Context, plan: EditPlan) -> None:
    """`MNIST(root, download=True)` on N processes downloads N times into one folder at once (and may read a half
    written file): the main process downloads first, the others then find the files."""
    for statement in _download_statements(ctx):
        call = next(c for c in ctx.descendants(statement) if type(c) is cst.Call and _fetches(ctx, c))
        downloads = any(a.keyword is not None and a.keyword.value == "download" for a in call.args)
        # an archive unpacked (or a file fetched) on every run, no `if not os.path.exists(...)` around it: after
        # the main process, the others would unpack it again over the files the main process is reading
        once = not downloads and not isinstance(statement, cst.If) and not _binds_names_used_elsewhere(ctx, statement)

        def wrap(u: cst.CSTNode, once: bool = once) -> cst.With:
            body = u.with_changes(leading_lines=[])
            if once:
                body = cst.If(test=accel("is_local_main_process"), body=cst.IndentedBlock(body=[body]))
            return cst.With(items=[cst.WithItem(accel_call("main_process_first"))],
                            body=cst.IndentedBlock(body=[body]), leading_lines=u.leading_lines)

        plan.edit(statement, wrap)
        what = "(..., download=...)" if downloads else "(...)"
        if once:
            plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}{what}` runs on the local main process "
                                               "only, under `with accelerator.main_process_first():`",
                               "it rewrites its files on every run: run again by the other processes, it would "
                               "overwrite them while the main process reads them")
            continue
        plan.report.change(ctx.line(call), f"`{ctx.code(call.func)}{what}` runs under "
                                           "`with accelerator.main_process_first():`",
                           "N processes downloading into one folder at once race; the main process downloads "
                           "first, the others then read its files")


def _binds_names_used_elsewhere(ctx: Context, statement: cst.CSTNode) -> bool:
    """`path = urlretrieve(url, name)[0]`, then `open(path)`: the others need the name too, so they run it."""
    inside = ctx.descendants(statement)
    bound = {n.name.value for n in inside if isinstance(n, cst.AsName) and isinstance(n.name, cst.Name)}
    bound |= {k for n in inside if isinstance(n, (cst.Assign, cst.AnnAssign)) for k, _, _ in bindings(n)}
    if not bound:
        return False
    scope = ctx.function(statement) or ctx.module
    inside_ids = {id(n) for n in inside}
    return any(type(n) is cst.Name and n.value in bound and id(n) not in inside_ids for n in ctx.descendants(scope))


def _prints(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    lines: list[int] = []
    models = facts.of_kind("model")
    for call in ctx.of_type(cst.Call):
        if isinstance(call.func, cst.Name) and call.func.value == "print" and "builtins.print" in ctx.qnames(call):
            plan.edit(call, lambda u: u.with_changes(func=accel("print")))
            plan.prints.append(call)
            lines.append(ctx.line(call))
            for arg in call.args:
                if dotted(arg.value) in models:  # print(model): the model, not the DDP wrapper around it
                    plan.edit(arg.value, lambda u: accel_call("unwrap_model", u))
                    plan.report.change(ctx.line(arg), f"`print({ctx.code(arg.value)})` prints "
                                                      f"`accelerator.unwrap_model({ctx.code(arg.value)})`",
                                       "after prepare() the variable holds the DDP/FSDP wrapper")
    if lines:
        listed = ", ".join(map(str, lines[:12])) + (", ..." if len(lines) > 12 else "")
        plural = "s" if len(lines) > 1 else ""
        plan.report.change(lines[0], f"`print(...)` -> `accelerator.print(...)` (line{plural} {listed})",
                           "only the main process prints, so N processes do not print everything N times")


def _unwrap(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    models = facts.of_kind("model")
    for attr in ctx.of_type(cst.Attribute):
        key = dotted(attr.value)
        name = attr.attr.value
        if key not in models or name in WRAPPER_SAFE or inside_class(ctx, attr, facts.model_classes):
            continue
        function, line = ctx.function(attr), ctx.line(attr)
        if name != "module" and any(site_function is function and line < site_line for site_function, site_line in
                                    plan.prepare_sites.get(key, ())):
            continue  # still the plain model here: it is prepared further down
        if name == "module":  # `model.module`, the DataParallel/DDP way to reach the inner model (any time)
            plan.edit(attr, lambda u: accel_call("unwrap_model", u.value))
            plan.report.change(ctx.line(attr), f"`{ctx.code(attr)}` -> `accelerator.unwrap_model({key})`",
                               "the wrapper depends on the launch; unwrap_model returns the inner model in every case")
            continue
        plan.edit(attr, lambda u: u.with_changes(value=accel_call("unwrap_model", u.value)))
        why = (f"`.{name}` belongs to the model class; a DDP/FSDP wrapper does not have it"
               if name not in {"state_dict", "load_state_dict"} else
               "the wrapper's state_dict keys carry a `module.` prefix; the inner model's load anywhere")
        plan.report.change(ctx.line(attr), f"`{ctx.code(attr)}` -> `accelerator.unwrap_model({key}).{name}`", why)
