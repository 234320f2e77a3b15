"""The edit plan the transforms fill in, and the one transformer that applies it.

Transforms only read the original tree and record edits keyed by original nodes; `PlanApplier` applies them in a
single bottom-up pass. Edits are functions of the *updated* node, so nested edits compose (a `torch.save` call whose
argument also gets `unwrap_model`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

import libcst as cst

from accelkit.convert.report import Report

Edit = Callable[[cst.CSTNode], cst.CSTNode]


class EditPlan:
    def __init__(self) -> None:
        self.edits: dict[cst.CSTNode, list[Edit]] = defaultdict(list)
        self.removed: set[cst.CSTNode] = set()  # small statements (or whole statements) to drop
        self.before: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.after: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)
        self.body_start: dict[cst.CSTNode, list[cst.BaseStatement]] = defaultdict(list)  # suite -> leading stmts
        self.accelerator_uses: list[cst.CSTNode] = []  # original nodes whose new code names `accelerator`
        self.library = False  # a library file: the Accelerator is made where used (see library.py)
        self.accelerator_args: dict[str, str] = {}  # extra Accelerator(...) arguments, e.g. cpu=args.no_cuda
        self.prepared: dict[str, str] = {}  # name -> where it is prepared ("line 77 (main)")
        self.prepare_sites: dict[str, list[tuple[cst.CSTNode | None, int]]] = defaultdict(list)  # (function, line)
        self.imports: list[str] = []  # names imported from accelerate besides Accelerator
        self.seeded: set[int] = set()  # statements already preceded by per-process seeds
        # (block, statement the data are sharded after, data name): line of the shard already added
        self.sharded: dict[tuple[int, int, str], int] = {}
        self.counted: set[int] = set()  # per-process batch counts already scaled to every process's (metrics.py)
        self.prints: list[cst.CSTNode] = []  # `print(...)` calls rewritten to `accelerator.print(...)`
        self.gated_output: list[cst.CSTNode] = []  # output statements put under `if accelerator.is_local_main_process:`
        self.report = Report()

    def edit(self, node: cst.CSTNode, fn: Edit, uses_accelerator: bool = True) -> None:
        self.edits[node].append(fn)
        if uses_accelerator:
            self.accelerator_uses.append(node)

    def remove(self, statement: cst.CSTNode) -> None:
        self.removed.add(statement)

    def insert_after(self, statement: cst.CSTNode, new: cst.BaseStatement, uses_accelerator: bool = True) -> None:
        self.after[statement].append(new)
        if uses_accelerator:
            self.accelerator_uses.append(statement)

    def insert_before(self, statement: cst.CSTNode, new: cst.BaseStatement, uses_accelerator: bool = True) -> None:
        self.before[statement].append(new)
        if uses_accelerator:
            self.accelerator_uses.append(statement)

    def is_removed(self, statement: cst.CSTNode) -> bool:
        if statement in self.removed:
            return True
        if isinstance(statement, cst.SimpleStatementLine):
            return all(s in self.removed for s in statement.body)
        if isinstance(statement, cst.If) and statement.orelse is None and isinstance(statement.body, cst.IndentedBlock):
            # `if n_gpus > 1: model = nn.DataParallel(model)` loses its only statement: the `if` goes too
            return all(self.is_removed(s) for s in statement.body.body)
        return False

    def touched(self) -> list[cst.CSTNode]:
        return [*self.edits, *self.removed, *self.before, *self.after, *self.body_start]

    @property
    def has_changes(self) -> bool:
        return bool(self.touched())


class PlanApplier(cst.CSTTransformer):
    def __init__(self, plan: EditPlan, dirty: set[int] | None = None) -> None:
        super().__init__()
        self.plan = plan
        self.dirty = dirty  # ids of the planned nodes and their ancestors: other subtrees are left as they are

    def on_visit(self, node: cst.CSTNode) -> bool:
        return self.dirty is None or id(node) in self.dirty

    def on_leave(self, original_node: cst.CSTNode, updated_node: cst.CSTNode):  # type: ignore[override]
        plan = self.plan
        node: cst.CSTNode = updated_node
        for fn in plan.edits.get(original_node, ()):
            node = fn(node)
        if isinstance(original_node, cst.BaseSmallStatement) and original_node in plan.removed:
            return cst.RemoveFromParent()
        if isinstance(original_node, cst.SimpleStatementLine) and isinstance(node, cst.SimpleStatementLine):
            if not node.body:  # every small statement on the line was removed
                return self._flatten(original_node, None)
            node = _fix_last_semicolon(node)
        if isinstance(original_node, cst.BaseStatement):
            if plan.is_removed(original_node):
                return self._flatten(original_node, None)
            if original_node in plan.before or original_node in plan.after:
                return self._flatten(original_node, node)
        if isinstance(original_node, (cst.IndentedBlock, cst.Module)):
            leading = plan.body_start.get(original_node)
            if leading:
                doc = _docstring(node.body)
                node = node.with_changes(body=[*doc, *leading, *node.body[len(doc):]])
            if isinstance(node, cst.IndentedBlock) and not node.body:
                node = node.with_changes(body=[cst.SimpleStatementLine([cst.Pass()])])
        return node

    def _flatten(self, original: cst.CSTNode, kept: cst.CSTNode | None):
        before = list(self.plan.before.get(original, ()))
        after = list(self.plan.after.get(original, ()))
        parts = [*before, *([kept] if kept is not None else []), *after]
        if not parts:
            return cst.RemoveFromParent()
        if isinstance(original, cst.BaseStatement) and (kept is None or before):
            # the comment lines above the original statement stay on top of whatever replaces it
            leading = kept.leading_lines if kept is not None else original.leading_lines
            if kept is not None:
                parts[len(before)] = kept.with_changes(leading_lines=[])
            parts[0] = parts[0].with_changes(leading_lines=[*leading, *parts[0].leading_lines])
        return cst.FlattenSentinel(parts)


def _docstring(body) -> list:
    if body and isinstance(body[0], cst.SimpleStatementLine) and body[0].body:
        first = body[0].body[0]
        if isinstance(first, cst.Expr) and isinstance(first.value, (cst.SimpleString, cst.ConcatenatedString)):
            return [body[0]]
    return []


def _fix_last_semicolon(line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
    last = line.body[-1]
    if getattr(last, "semicolon", cst.MaybeSentinel.DEFAULT) is not cst.MaybeSentinel.DEFAULT:
        return line.with_changes(body=[*line.body[:-1], last.with_changes(semicolon=cst.MaybeSentinel.DEFAULT)])
    return line
