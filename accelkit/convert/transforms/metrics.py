"""Evaluation loops over a prepared DataLoader: gather predictions and labels with `gather_for_metrics`, so metrics
summed over a sharded dataset are computed over all of it (and the duplicates padding the last batch are dropped)."""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context, dotted, names_of
from accelkit.convert.plan import Plan


def apply(ctx: Context, facts: Facts, plan: Plan, options: object) -> None:
    models = facts.of_kind("model")
    for loop, batch_names in facts.loader_loops:
        inside = ctx.descendants(loop.body)
        if any(type(n) is cst.Attribute and n.attr.value in {"backward", "step"} for n in inside):
            continue  # a training loop: per-process losses are what the step needs
        found = _model_call(loop.body, models)
        if found is None:
            continue
        line, output, call = found
        inputs = names_of(ctx.descendants(call), ctx)
        later = names_of(ctx.following(line, loop.body), ctx)
        labels = [n for n in sorted(batch_names) if n not in inputs and n in later]
        if not labels:
            plan.report.leave(ctx.line(line), "an evaluation loop whose labels could not be identified: metrics are "
                                              "computed on each process's shard only",
                              "gather predictions and labels with `accelerator.gather_for_metrics((preds, labels))` "
                              "before computing the metric")
            continue
        names = ", ".join([output, *labels])
        plan.insert_after(line, cst.parse_statement(f"{names} = accelerator.gather_for_metrics(({names}))\n"))
        plan.report.change(ctx.line(line), f"added `{names} = accelerator.gather_for_metrics(({names}))` after it",
                           "each process evaluates a shard; gathering makes the metric cover the whole dataset")


def _model_call(block: cst.BaseSuite, models: set[str]):
    """First `out = model(...)` line in the loop body (looking into `with` blocks)."""
    if not isinstance(block, cst.IndentedBlock):
        return None
    for line in block.body:
        if isinstance(line, cst.With):
            found = _model_call(line.body, models)
            if found is not None:
                return found
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if (isinstance(small, cst.Assign) and len(small.targets) == 1 and isinstance(small.value, cst.Call)
                    and dotted(small.value.func) in models):
                output = dotted(small.targets[0].target)
                if output is not None and "." not in output:
                    return line, output, small.value
    return None
