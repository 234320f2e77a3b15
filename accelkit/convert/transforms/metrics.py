"""Evaluation loops over a prepared DataLoader: gather predictions and labels with `gather_for_metrics`, so metrics
summed over a sharded dataset are computed over all of it (and the duplicates padding the last batch are dropped)."""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context, contains_backward, dotted, names_in
from accelkit.convert.plan import Plan


def apply(ctx: Context, facts: Facts, plan: Plan, options: object) -> None:
    models = facts.of_kind("model")
    for loop, batch_names in facts.loader_loops:
        if contains_backward(loop.body) or _calls_step(loop.body):
            continue  # a training loop: per-process losses are what the step needs
        found = _model_call(loop.body, models)
        if found is None:
            continue
        line, output, call = found
        inputs = names_in(call)
        later = _names_after(loop.body, line)
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


def _calls_step(node: cst.CSTNode) -> bool:
    return any(isinstance(n, cst.Attribute) and n.attr.value == "step" for n in _walk(node))


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


def _names_after(block: cst.CSTNode, line: cst.CSTNode) -> set[str]:
    seen = False
    found: set[str] = set()
    for node in _walk(block):
        if node is line:
            seen = True
            continue
        if seen and isinstance(node, cst.BaseStatement) and not _inside(node, line):
            found |= names_in(node)
    return found


def _inside(node: cst.CSTNode, container: cst.CSTNode) -> bool:
    return any(n is node for n in _walk(container))


def _walk(node: cst.CSTNode) -> list[cst.CSTNode]:
    out: list[cst.CSTNode] = []

    class _All(cst.CSTVisitor):
        def on_visit(self, n: cst.CSTNode) -> bool:
            out.append(n)
            return True

    node.visit(_All())
    return out
