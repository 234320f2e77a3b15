"""`accelerator.prepare(...)` for models, optimizers, DataLoaders and LR schedulers.

Objects created in the same block are prepared together, right after the last of them is created and before any of
them is used (creating the optimizer from `model.parameters()` or the scheduler from the optimizer is not a use).
When a later object is created only after an earlier one is already in use, a second prepare call follows it.
Objects built in a `return` statement are prepared where they are returned.
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts, Tracked
from accelkit.convert.context import Context, accel_call, names_in
from accelkit.convert.plan import Plan

PREPARED = {"model", "optimizer", "loader", "scheduler"}
KIND_ORDER = ["model", "optimizer", "loader", "scheduler"]
WHY = ("prepare() wraps the model for the launched backend (DDP/FSDP/DeepSpeed) and places it, shards each "
       "DataLoader across processes, and makes optimizer/scheduler steps work with mixed precision")


def apply(ctx: Context, facts: Facts, plan: Plan, options: object) -> None:
    by_suite: dict[int, tuple[cst.CSTNode, list[Tracked]]] = {}
    for item in facts.created:
        if item.kind not in PREPARED or item.statement is None:
            continue
        if item.returned:
            plan.edit(item.small, lambda u: u.with_changes(value=accel_call("prepare", u.value)))
            plan.report.change(ctx.line(item.small), f"`return {ctx.code(item.value)}` now returns it prepared", WHY)
            continue
        suite = ctx.suite_of(item.statement)
        if suite is None:
            plan.report.leave(ctx.line(item.statement), f"`{item.key}` is created in a one-line block",
                              f"add `{item.key} = accelerator.prepare({item.key})` after it")
            continue
        by_suite.setdefault(id(suite), (suite, []))[1].append(item)
    for suite, items in by_suite.values():
        _prepare_block(ctx, plan, suite, items)
    if not any(item.kind == "loader" for item in facts.created):
        _note_manual_batching(ctx, plan)


def _note_manual_batching(ctx: Context, plan: Plan) -> None:
    for loop in ctx.of_type(cst.For):
        if any(type(n) is cst.Name and n.value == "backward" for n in ctx.descendants(loop.body)):
            plan.report.leave(ctx.line(loop), "the training loop batches its data by hand (no DataLoader): after "
                                              "conversion every process trains on all of the data",
                              "wrap the data in a torch.utils.data.DataLoader (TensorDataset for tensors) and add it "
                              "to accelerator.prepare(...) so each process gets its own shard")
            return


def _prepare_block(ctx: Context, plan: Plan, suite: cst.CSTNode, items: list[Tracked]) -> None:
    body = list(suite.body)  # type: ignore[attr-defined]
    index = {id(line): i for i, line in enumerate(body)}
    creation_lines = {id(item.statement) for item in items}
    refs = [names_in(line, plan.removed) for line in body]

    def first_use(item: Tracked, created_at: int) -> int:
        for j in range(created_at + 1, len(body)):
            line = body[j]
            if id(line) in creation_lines or plan.is_removed(line):
                continue
            if item.key in refs[j]:
                return j
        return len(body)

    # the last creation of each name in this block is the one prepared
    latest: dict[str, Tracked] = {}
    for item in sorted(items, key=lambda t: index[id(t.statement)]):
        latest[item.key] = item
    ordered = sorted(latest.values(), key=lambda t: index[id(t.statement)])
    group: list[Tracked] = []
    bound = len(body)
    for item in ordered:
        created = index[id(item.statement)]
        if group and created >= bound:
            _emit(ctx, plan, body, index, group)
            group, bound = [], len(body)
        group.append(item)
        bound = min(bound, first_use(item, created))
    if group:
        _emit(ctx, plan, body, index, group)


def _emit(ctx: Context, plan: Plan, body: list, index: dict[int, int], group: list[Tracked]) -> None:
    anchor = max((item.statement for item in group), key=lambda s: index[id(s)])
    group = sorted(group, key=lambda item: KIND_ORDER.index(item.kind))
    names = ", ".join(item.key for item in group)
    code = f"{names} = accelerator.prepare({names})\n"
    if len(code) + 4 * _depth(ctx, anchor) > 100:  # keep long lines readable
        code = f"{names} = accelerator.prepare(\n    {names}\n)\n"
    plan.insert_after(anchor, cst.parse_statement(code))
    kinds = ", ".join(f"{item.key} ({item.kind})" for item in group)
    plan.report.change(ctx.line(anchor), f"added `{names} = accelerator.prepare({names})` after this line: {kinds}",
                       WHY)


def _depth(ctx: Context, node: cst.CSTNode) -> int:
    return sum(isinstance(a, cst.IndentedBlock) for a in ctx.ancestors(node))
