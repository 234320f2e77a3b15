"""One random task for every process: an unseeded script that draws random data before training (module-level
target weights, a synthetic dataset) would draw a different task on each process, since torch, numpy and `random`
seed themselves from the OS per process. The 2-process run would then average gradients of different problems and
never meet the script's stop criterion. The conversion seeds the generators the script draws from, with one seed for
every process, before anything runs; per-process streams for the batches (batches.py) are split off later, right
before training.
"""

from __future__ import annotations

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context
from accelkit.convert.edits import EditPlan
from accelkit.convert.flow import LOOPS, Flow
from accelkit.convert.library import is_library
from accelkit.convert.transforms.batches import NOISE, RANDOM_INDEX, SEEDS

PER_SAMPLE = {"__getitem__", "__iter__", "__next__", "forward", "__call__"}  # per-sample or in-model randomness
COMMON_SEED = 0


def apply(ctx: Context, facts: Facts, plan: EditPlan, options: object) -> None:
    if is_library(ctx) or any(ctx.qnames(c) & SEEDS for c in ctx.of_type(cst.Call)):
        return
    flow = Flow(ctx, facts)
    in_training = _reached_from_training(ctx, flow)
    # library -> (the script's name for its module or None, first draw's line, whether the library's name is taken)
    libraries: dict[str, tuple[str | None, int, bool]] = {}
    for call in ctx.of_type(cst.Call):
        library = _library_of(ctx, call)
        if library is None or _per_step(ctx, flow, call, in_training):
            continue
        alias = _module_alias(ctx, call, library)
        libraries.setdefault(library, (alias, ctx.line(call), alias is None and ctx.binds(library)))
    if not libraries:
        return
    anchor = _first_executed(ctx)
    if anchor is None:
        return
    seeds = [seed for library, (alias, _, taken) in libraries.items()
             for seed in _seed_statements(library, alias, taken)]
    statement = cst.parse_statement("; ".join(seeds) + "\n")
    statement = statement.with_changes(leading_lines=[cst.EmptyLine(comment=cst.Comment(
        "# one random task on every process: the script draws its data without a seed (see the report)"))])
    plan.insert_before(anchor, statement, uses_accelerator=False)
    first = min(line for _, line, _ in libraries.values())
    plan.report.change(ctx.line(anchor), f"added `{'; '.join(seeds)}` before the script's first statement",
                       f"the script draws random data before training without a seed (line {first}): each process "
                       "would draw a different task and the processes would train on different problems; one seed "
                       "for every process keeps one task (change the seed for another draw)")


def _module_alias(ctx: Context, call: cst.Call, library: str) -> str | None:
    """The script's name for the library module itself (`torch`, `np`, `rnd`), when the draw is reached through it;
    None for a function imported by name (`from torch import randn`: `randn` is no module to seed)."""
    root = call.func
    while isinstance(root, cst.Attribute):
        root = root.value
    return root.value if isinstance(root, cst.Name) and ctx.qnames(root) == {library} else None


def _seed_statements(library: str, alias: str | None, taken: bool) -> list[str]:
    """The seed call on the library's module; with an import of it when the script names none (under a name of its
    own when the library's name is `taken`: `from random import random` binds `random` to a function)."""
    imports: list[str] = []
    if alias is None:
        alias = f"{library}_for_seed" if taken else library
        imports.append(f"import {library}" + (f" as {alias}" if taken else ""))
    call = {"torch": "manual_seed", "numpy": "random.seed", "random": "seed"}[library]
    return [*imports, f"{alias}.{call}({COMMON_SEED})"]


def _library_of(ctx: Context, call: cst.Call) -> str | None:
    for q in ctx.qnames(call):
        if q in NOISE or q in RANDOM_INDEX or q.startswith("torch.rand"):
            return "torch" if q.startswith("torch.") else "numpy" if q.startswith("numpy.") else "random"
        if q.startswith("numpy.random.") and q.rsplit(".", 1)[-1] not in {"seed", "default_rng", "RandomState",
                                                                            "Generator"}:
            return "numpy"
    return None


def _reached_from_training(ctx: Context, flow: Flow) -> set[int]:
    """The script's functions a training loop calls (directly or through one another): their draws are per step."""
    frontier = [loop for loop in ctx.of_type(cst.For, cst.While) if flow.trains(loop)]
    seen: set[int] = set()
    for _ in range(3):
        frontier = [f for node in frontier for f in flow.callees(node) if id(f) not in seen]
        seen |= {id(f) for f in frontier}
    return seen


def _per_step(ctx: Context, flow: Flow, call: cst.Call, in_training: set[int]) -> bool:
    """A draw made inside a training loop, a helper it calls, a model, or per sample: not part of the task."""
    if any(isinstance(a, cst.Arg) and a.keyword is not None and a.keyword.value == "generator"
           for a in call.args):  # drawn from its own seeded generator
        return True
    for ancestor in ctx.ancestors(call):
        if isinstance(ancestor, LOOPS) and flow.trains(ancestor):
            return True
        if isinstance(ancestor, cst.FunctionDef) and (id(ancestor) in in_training or ancestor.name.value in
                                                      PER_SAMPLE):
            return True
    return False


def _first_executed(ctx: Context) -> cst.CSTNode | None:
    """The module's first statement that is not an import, a definition or the docstring."""
    for index, line in enumerate(ctx.module.body):
        if isinstance(line, (cst.FunctionDef, cst.ClassDef)):
            continue
        if isinstance(line, cst.SimpleStatementLine) and all(
                isinstance(s, (cst.Import, cst.ImportFrom)) or (index == 0 and isinstance(s, cst.Expr) and
                                                                isinstance(s.value, cst.SimpleString))
                for s in line.body):
            continue
        return line
    return None
