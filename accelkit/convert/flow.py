"""Control flow questions the transforms ask: which block a statement belongs to, which loop encloses it, which
loops train (run a backward pass, directly or through the script's own functions), and where optimizer steps are.

A "block" here is where a prepare() call can go: the body of a function, of a loop, of the module-level
`if __name__ == "__main__":`, or the module. `if`, `with`
and `try` are looked through (an object created in both branches of an `if` is prepared after the `if`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cached_property

import libcst as cst

from accelkit.convert.analysis import Facts
from accelkit.convert.context import Context, dotted

LOOPS = (cst.For, cst.While)
BLOCK_OWNERS = (cst.FunctionDef, cst.For, cst.While, cst.Module)


class Flow:
    def __init__(self, ctx: Context, facts: Facts) -> None:
        self.ctx = ctx
        self.facts = facts
        self._steps_once: dict[int, bool] = {}

    # -- blocks ----------------------------------------------------------------------------------------------
    def block_of(self, node: cst.CSTNode) -> cst.Module | cst.IndentedBlock | None:
        """The body (function, loop or module) whose top-level statements contain `node`."""
        for ancestor in self.ctx.ancestors(node):
            if isinstance(ancestor, cst.Module):
                return ancestor
            if isinstance(ancestor, cst.If) and isinstance(ancestor.body, cst.IndentedBlock) \
                    and self.ctx.main_guard(node) is ancestor and self._inside(node, ancestor.body):
                return ancestor.body  # `if __name__ == "__main__":` is the script's main function
            if isinstance(ancestor, (cst.FunctionDef, cst.For, cst.While)):
                body = ancestor.body
                return body if isinstance(body, cst.IndentedBlock) and self._inside(node, body) else None
        return None

    def _inside(self, node: cst.CSTNode, body: cst.CSTNode) -> bool:
        return self.ctx.contains(body, node)

    def top_statement(self, node: cst.CSTNode, block: cst.CSTNode) -> cst.BaseStatement | None:
        return self.ctx.top_statement_in(node, block)  # type: ignore[arg-type]

    def block_name(self, block: cst.CSTNode) -> str:
        """`Trainer.run`, `main` or `module level`, for messages."""
        function = block if isinstance(block, cst.FunctionDef) else None
        if not isinstance(block, cst.Module) and self.ctx.main_guard(block) is not None:
            return "`if __name__ == \"__main__\":`"
        for ancestor in [block, *self.ctx.ancestors(block)]:
            if isinstance(ancestor, cst.FunctionDef):
                function = ancestor
                break
        if function is None:
            return "module level"
        owner = next((a for a in self.ctx.ancestors(function) if isinstance(a, cst.ClassDef)), None)
        return f"{owner.name.value}.{function.name.value}" if owner else function.name.value

    # -- the script's own functions --------------------------------------------------------------------------
    @cached_property
    def functions(self) -> dict[str, list[cst.FunctionDef]]:
        """Functions and methods defined in the script, by name (a call `self._run_batch(...)` finds the method)."""
        found: dict[str, list[cst.FunctionDef]] = {}
        for function in self.ctx.of_type(cst.FunctionDef):
            found.setdefault(function.name.value, []).append(function)
        return found

    def callees(self, node: cst.CSTNode, outside_loops: bool = False) -> list[cst.FunctionDef]:
        """The script's functions called inside `node` (by name: `f(...)`, `self.f(...)`, `obj.f(...)`); with
        `outside_loops`, not counting calls made in loops nested in `node`."""
        out = []
        for call in self.ctx.descendants(node):
            if type(call) is not cst.Call:
                continue
            if outside_loops and self._in_loop_below(call, node):
                continue
            func = call.func  # type: ignore[attr-defined]
            name = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) \
                else None
            out += self.functions.get(name, []) if name else []
        return out

    # -- training --------------------------------------------------------------------------------------------
    @cached_property
    def backward_calls(self) -> list[cst.Call]:
        return [c for c in self.ctx.of_type(cst.Call) if isinstance(c.func, cst.Attribute)
                and c.func.attr.value == "backward" and not any(q.startswith("torch.autograd")
                                                                  for q in self.ctx.qnames(c))]

    @cached_property
    def optimizer_steps(self) -> list[cst.Call]:
        """`opt.step()` of a known optimizer, and `scaler.step(opt)`."""
        steps = []
        for call in self.ctx.of_type(cst.Call):
            func = call.func
            if not (isinstance(func, cst.Attribute) and func.attr.value == "step"):
                continue
            kind = self.facts.kind(func.value)
            if kind == "optimizer" or (kind == "scaler" and call.args):
                steps.append(call)
        return steps

    def runs(self, node: cst.CSTNode, calls: list[cst.Call], depth: int = 3) -> bool:
        """`node` contains one of `calls`, directly or through the script's functions it calls."""
        if any(self._inside(c, node) or c is node for c in calls):
            return True
        if depth == 0:
            return False
        return any(self.runs(f.body, calls, depth - 1) for f in self.callees(node) if f is not node)

    def trains(self, node: cst.CSTNode) -> bool:
        return self.runs(node, self.backward_calls)  # type: ignore[arg-type]

    def innermost_loop(self, node: cst.CSTNode) -> cst.For | cst.While | None:
        for ancestor in self.ctx.ancestors(node):
            if isinstance(ancestor, cst.FunctionDef):
                return None
            if isinstance(ancestor, LOOPS):
                return ancestor  # type: ignore[return-value]
        return None

    def steps_once_per_iteration(self, loop_or_function: cst.CSTNode) -> bool:
        """An optimizer step happens in this loop's (or function's) own body, not in a loop nested inside it:
        directly, or in a function called from the body that steps without looping."""
        known = self._steps_once.get(id(loop_or_function))
        if known is None:  # asked once per scheduler step call: the answer per loop is kept
            self._steps_once[id(loop_or_function)] = False  # a recursion through the script's functions stops here
            known = self._steps_once[id(loop_or_function)] = self._steps_once_per_iteration(loop_or_function)
        return known

    def _steps_once_per_iteration(self, loop_or_function: cst.CSTNode) -> bool:
        body = loop_or_function.body  # type: ignore[attr-defined]
        for step in self.optimizer_steps:
            if self._inside(step, body) and self._nearest(step) is loop_or_function:
                return True
        for callee in self.callees(body, outside_loops=True):
            if callee is not loop_or_function and self.steps_once_per_iteration(callee):
                return True
        return False

    def _in_loop_below(self, node: cst.CSTNode, top: cst.CSTNode) -> bool:
        for ancestor in self.ctx.ancestors(node):
            if ancestor is top:
                return False
            if isinstance(ancestor, LOOPS):
                return True
        return False

    def _nearest(self, node: cst.CSTNode) -> cst.CSTNode | None:
        """The innermost loop or function around `node`."""
        for ancestor in self.ctx.ancestors(node):
            if isinstance(ancestor, (*LOOPS, cst.FunctionDef)):
                return ancestor
        return None

    def cadence(self, call: cst.Call) -> str:
        """How often a `scheduler.step()` call runs: "batch" (with every optimizer step) or "epoch" (less often)."""
        owner = self._nearest(call)
        if owner is None:
            return "epoch"
        return "batch" if self.steps_once_per_iteration(owner) else "epoch"

    def loops_in(self, node: cst.CSTNode) -> Iterator[cst.For | cst.While]:
        for n in self.ctx.descendants(node):
            if isinstance(n, LOOPS):
                yield n  # type: ignore[misc]


def references(ctx: Context, node: cst.CSTNode, key: str) -> list[cst.CSTNode]:
    """Nodes inside `node` that refer to the dotted name `key` (`model` or `self.model`)."""
    found = []
    for n in ctx.descendants(node):
        if type(n) is cst.Name and n.value == key:
            parent = ctx.parent(n)
            if type(parent) is cst.Attribute and parent.attr is n:  # type: ignore[union-attr]
                continue
            found.append(n)
        elif type(n) is cst.Attribute and dotted(n) == key:  # type: ignore[arg-type]
            found.append(n)
    return found
