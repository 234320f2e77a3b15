"""torch.distributed scripts become Accelerate scripts (the documented DDP -> Accelerate migration, done by hand
today): the launcher's environment and the process group are Accelerate's, so the script stops making them.

- `init_process_group(...)` / `destroy_process_group()` go; Accelerator() joins the group the launcher set up.
- rank and world size come from the Accelerator: `dist.get_rank()` -> `accelerator.process_index`,
  `int(os.environ["LOCAL_RANK"])` -> `accelerator.local_process_index`, ... (a nanoGPT-style "DDP if RANK is set,
  else single device" test is then always true, and the script has one path that runs on 1 or N processes).
- `DDP(model, device_ids=[...])` goes (prepare wraps for the launched backend; see devices.py, which treats it as
  it treats DataParallel); its options go to `DistributedDataParallelKwargs`.
- a `DistributedSampler` goes (prepare shards the loader; keeping it would shard twice), its `shuffle` moves to
  the DataLoader, and `sampler.set_epoch(epoch)` goes (prepared loaders reshuffle every epoch).
- `model.no_sync()` -> `accelerator.no_sync(model)`; `dist.barrier()` -> `accelerator.wait_for_everyone()`.
- collectives on metrics become Accelerate's, in place as the originals were: `dist.all_reduce(t)` ->
  `t.copy_(accelerator.reduce(t, "sum"))`, MAX/MIN through `accelerator.gather`, `dist.all_gather(out, t)` ->
  `out[:] = accelerator.gather(t[None]).unbind(0)`. On one process (no group) they are the identity.
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts, bindings
from accelkit.convert.context import Context, accel, dotted
from accelkit.convert.edits import EditPlan

DIST = "torch.distributed."
SETUP = {"torch.distributed.init_process_group", "torch.distributed.destroy_process_group"}
SAMPLERS = {"torch.utils.data.distributed.DistributedSampler", "torch.utils.data.DistributedSampler"}
DDP_OPTIONS = {"find_unused_parameters", "static_graph", "gradient_as_bucket_view", "broadcast_buffers",
               "bucket_cap_mb", "check_reduction"}
QUERIES = {"get_rank": "process_index", "get_world_size": "num_processes", "is_initialized": "use_distributed",
           "get_local_rank": "local_process_index"}
ENV = {"RANK": "process_index", "LOCAL_RANK": "local_process_index", "WORLD_SIZE": "num_processes",
       "SLURM_PROCID": "process_index", "SLURM_LOCALID": "local_process_index", "SLURM_NTASKS": "num_processes"}
LEFT = {"broadcast", "all_gather_object", "broadcast_object_list", "scatter", "gather", "reduce_scatter",
        "all_to_all", "send", "recv", "gather_object", "all_gather_into_tensor", "reduce_scatter_tensor"}
OPS = {"SUM": "sum", "AVG": "mean", "MAX": "amax", "MIN": "amin", "PRODUCT": "prod"}
WHY_LAUNCH = ("the launcher (accelkit launch / accelerate launch / torchrun) sets up the processes and "
              "Accelerator() joins their group; the script no longer creates or destroys it")


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    if not any(q.startswith(DIST) or q in SAMPLERS for call in ctx.of_type(cst.Call) for q in ctx.qnames(call)) \
            and not facts.wrappers:
        return
    _setup_and_teardown(ctx, plan)
    _queries(ctx, plan)
    _environment(ctx, plan)
    _samplers(ctx, plan)
    _ddp_options(ctx, facts, plan)
    _no_sync(ctx, facts, plan)
    _collectives(ctx, plan)


def _call_statement(ctx: Context, call: cst.Call) -> cst.BaseSmallStatement | None:
    small = ctx.small_statement(call)
    return small if isinstance(small, cst.Expr) and small.value is call else None


def _setup_and_teardown(ctx: Context, plan: EditPlan) -> None:
    for call in ctx.of_type(cst.Call):
        if not ctx.qnames(call) & SETUP:
            continue
        small = _call_statement(ctx, call)
        if small is None:
            continue
        plan.remove(small)
        plan.report.change(ctx.line(call), f"removed `{ctx.code(call)}`", WHY_LAUNCH)


def _queries(ctx: Context, plan: EditPlan) -> None:
    for call in ctx.of_type(cst.Call):
        names = ctx.qnames(call)
        name = next((q[len(DIST):] for q in names if q.startswith(DIST)), None)
        if name == "barrier":
            plan.edit(call, lambda u: u.with_changes(func=accel("wait_for_everyone"), args=[]))
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.wait_for_everyone()`",
                               "the same barrier, over the processes Accelerate runs")
        elif name in QUERIES and not call.args:
            attr = QUERIES[name]
            plan.edit(call, lambda u, a=attr: accel(a))
            plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.{attr}`",
                               "the rank and world size are the Accelerator's (it is 0 and 1 on one process, "
                               "where there is no process group to ask)")


def _env_name(ctx: Context, node: cst.CSTNode) -> str | None:
    """"RANK" of `os.environ["RANK"]`, `os.environ.get("RANK", d)`, `os.getenv("RANK")`."""
    key = None
    if isinstance(node, cst.Subscript) and "os.environ" in ctx.qnames(node.value) and len(node.slice) == 1:
        index = node.slice[0].slice
        key = index.value if isinstance(index, cst.Index) else None
    elif isinstance(node, cst.Call) and node.args and (ctx.qnames(node) & {"os.environ.get", "os.getenv"}):
        key = node.args[0].value
    if isinstance(key, cst.SimpleString) and isinstance(key.evaluated_value, str) and key.evaluated_value in ENV:
        return key.evaluated_value
    return None


def asks_the_rank(ctx: Context, node: cst.CSTNode) -> bool:
    """`node` reads this process's global rank: `os.environ["RANK"]` (or SLURM_PROCID) or `dist.get_rank()`."""
    for n in [node, *ctx.descendants(node)]:
        if _env_name(ctx, n) in {"RANK", "SLURM_PROCID"}:
            return True
        if isinstance(n, cst.Call) and "torch.distributed.get_rank" in ctx.qnames(n):
            return True
    return False


def _environment(ctx: Context, plan: EditPlan) -> None:
    for node in ctx.of_type(cst.Subscript, cst.Call):
        name = _env_name(ctx, node)
        if name is None:
            continue
        attr = ENV[name]
        parent = ctx.parent(ctx.parent(node) or node)
        holder = ctx.parent(node)
        if isinstance(holder, cst.Arg) and isinstance(parent, cst.Call) and ctx.code(parent.func) == "int":
            plan.edit(parent, lambda u, a=attr: accel(a))  # `int(os.environ["RANK"])`
            what = ctx.code(parent)
            new = f"accelerator.{attr}"
        else:
            plan.edit(node, lambda u, a=attr: cst.Call(func=cst.Name("str"), args=[cst.Arg(accel(a))]))
            what = ctx.code(node)
            new = f"str(accelerator.{attr})"
        plan.report.change(ctx.line(node), f"`{what}` -> `{new}`",
                           f"{name} is set by torchrun-style launchers only; the Accelerator knows it under every "
                           "launcher, and on one process (the script then has one path for 1 or N processes)")


def _samplers(ctx: Context, plan: EditPlan) -> None:
    """DistributedSampler -> the DataLoader's own shuffle; prepare() shards it (and reshuffles every epoch)."""
    named: dict[str, str] = {}  # sampler variable -> shuffle expression
    inline = False  # `DataLoader(ds, sampler=DistributedSampler(ds))`: reached later as `loader.sampler`
    for call in ctx.of_type(cst.Call):
        if not ctx.qnames(call) & SAMPLERS:
            continue
        inline = True
        shuffle = next((ctx.code(a.value) for a in call.args if a.keyword is not None
                        and a.keyword.value == "shuffle"), "True")
        holder = ctx.parent(call)
        if isinstance(holder, cst.Arg) and holder.keyword is not None and holder.keyword.value == "sampler":
            _sampler_argument(ctx, plan, ctx.parent(holder), shuffle)  # type: ignore[arg-type]
            continue
        small = ctx.small_statement(call)
        targets = [k for k, v, _ in bindings(small)] if small is not None else []
        if len(targets) == 1 and isinstance(small, cst.Assign) and small.value is call:
            named[targets[0]] = shuffle
            plan.remove(small)
            plan.report.change(ctx.line(call), f"removed `{ctx.code(small)}`",
                               "accelerator.prepare() shards the DataLoader across processes; a DistributedSampler "
                               "as well would shard it twice (each process would see 1/N of its share)")
        else:
            plan.report.problem(ctx.line(call), f"`{ctx.code(call)}` is used in a way the conversion does not follow",
                                "remove the DistributedSampler: accelerator.prepare() shards the DataLoader")
    if not named and not inline:
        return
    for call in ctx.of_type(cst.Call):
        for arg in call.args:
            if arg.keyword is not None and arg.keyword.value == "sampler" and dotted(arg.value) in named:
                _sampler_argument(ctx, plan, call, named[dotted(arg.value)])  # type: ignore[index]
        func = call.func
        # `sampler.set_epoch(e)`, and `loader.sampler.set_epoch(e)` / `self.train_data.sampler.set_epoch(e)` (a
        # Trainer holding the loader): the loader's sampler is no longer distributed (a prepared loader's plain
        # sampler has no set_epoch: an AttributeError on the first epoch)
        if isinstance(func, cst.Attribute) and func.attr.value == "set_epoch" and (
                dotted(func.value) in named or (isinstance(func.value, cst.Attribute)
                                                and func.value.attr.value == "sampler")):
            small = _call_statement(ctx, call)
            if small is not None:
                plan.remove(small)
                plan.report.change(ctx.line(call), f"removed `{ctx.code(call)}`",
                                   "a prepared DataLoader reshuffles every epoch by itself")


def _sampler_argument(ctx: Context, plan: EditPlan, loader: cst.Call, shuffle: str) -> None:
    def edit(u: cst.Call) -> cst.Call:
        args = [a for a in u.args if a.keyword is None or a.keyword.value not in {"sampler", "shuffle"}]
        new = cst.Arg(value=cst.parse_expression(shuffle), keyword=cst.Name("shuffle"),
                      equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                            whitespace_after=cst.SimpleWhitespace("")))
        if args:
            args[-1] = args[-1].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
        return u.with_changes(args=[*args, new])

    plan.edit(loader, edit, uses_accelerator=False)
    plan.report.change(ctx.line(loader), f"`{ctx.code(loader.func)}(...)`: the DistributedSampler is replaced by "
                                         f"`shuffle={shuffle}`",
                       "accelerator.prepare() shards the DataLoader (in a DistributedSampler's order) and keeps "
                       "the shuffle the sampler had")


def _ddp_options(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    for _, call in facts.wrappers:
        options = [a for a in call.args if a.keyword is not None and a.keyword.value in DDP_OPTIONS]
        if not options:
            continue
        given = ", ".join(f"{a.keyword.value}={ctx.code(a.value)}" for a in options)  # type: ignore[union-attr]
        plan.accelerator_args["kwargs_handlers"] = f"[DistributedDataParallelKwargs({given})]"
        if "DistributedDataParallelKwargs" not in plan.imports:
            plan.imports.append("DistributedDataParallelKwargs")
        plan.report.change(ctx.line(call), f"DDP options `{given}` -> `Accelerator(kwargs_handlers="
                                           f"[DistributedDataParallelKwargs({given})])`",
                           "prepare() builds the DDP wrapper; these options reach it through the Accelerator")


def _no_sync(ctx: Context, facts: Facts, plan: EditPlan) -> None:
    models = facts.of_kind("model")
    for call in ctx.of_type(cst.Call):
        func = call.func
        if not (isinstance(func, cst.Attribute) and func.attr.value == "no_sync" and not call.args
                and dotted(func.value) in models):
            continue
        plan.edit(call, lambda u: cst.Call(func=accel("no_sync"), args=[cst.Arg(u.func.value)]))
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `accelerator.no_sync({ctx.code(func.value)})`",
                           "the same accumulation without gradient sync, for whichever wrapper the launch uses "
                           "(FSDP and DeepSpeed too)")


def _collectives(ctx: Context, plan: EditPlan) -> None:
    for call in ctx.of_type(cst.Call):
        names = ctx.qnames(call)
        name = next((q[len(DIST):] for q in names if q.startswith(DIST)), None)
        if name in LEFT:
            plan.report.leave(ctx.line(call), f"`{ctx.code(call)}` is left as it is",
                              "it works once Accelerate has set up the process group (2+ processes); on one "
                              "process there is none: use accelerator.gather / accelerate.utils.broadcast")
            continue
        if name not in {"all_reduce", "reduce", "all_gather"}:
            continue
        small = _call_statement(ctx, call)
        if small is None or not call.args:
            continue
        if name == "all_gather":
            if len(call.args) < 2:
                continue
            out, tensor = ctx.code(call.args[0].value), ctx.code(call.args[1].value)
            code = f"{out}[:] = accelerator.gather({tensor}[None]).unbind(0)"
        else:
            tensor = ctx.code(call.args[0].value)
            # all_reduce(tensor, op), reduce(tensor, dst, op): the op is the keyword or that position
            position = 1 if name == "all_reduce" else 2
            positional = [a for a in call.args if a.keyword is None]
            op_arg = next((a for a in call.args if a.keyword is not None and a.keyword.value == "op"),
                          positional[position] if len(positional) > position else None)
            op = "SUM" if op_arg is None else ctx.code(op_arg.value).rsplit(".", 1)[-1]
            reduction = OPS.get(op)
            if reduction is None:
                continue
            if reduction in {"sum", "mean"}:
                code = f'{tensor}.copy_(accelerator.reduce({tensor}, "{reduction}"))'
            else:
                code = f"{tensor}.copy_(accelerator.gather({tensor}[None]).{reduction}(0))"
        new = cst.parse_statement(code + "\n").body[0]
        plan.edit(small, lambda u, n=new: n)
        plan.report.change(ctx.line(call), f"`{ctx.code(call)}` -> `{code}`",
                           "Accelerate's collective over the launched processes, in place like the original (the "
                           "identity on one process, where torch.distributed has no group)")
