"""What the conversion did and what it left for a human, with the line numbers of the input script."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

SNIPPET = re.compile(r"`([^`]{91,})`")


def _shorten(text: str) -> str:
    """Long code snippets in a report line are cut to their first 87 characters."""
    return SNIPPET.sub(lambda m: f"`{m.group(1)[:87]}...`", text)


@dataclass(frozen=True)
class Change:
    line: int  # line in the input script (0 = whole file)
    what: str
    why: str


@dataclass(frozen=True)
class LeftAlone:
    line: int
    why: str
    todo: str


@dataclass(frozen=True)
class Problem:
    """Something the conversion could not do correctly: the output would not train the same model on N processes
    (or would report wrong numbers) until a human fixes it."""

    line: int
    what: str
    todo: str

    def format(self) -> str:
        return f"{self.where()}; to do: {self.todo}"

    def where(self) -> str:
        return f"line {self.line}: {self.what}" if self.line else self.what


@dataclass(frozen=True)
class Found:
    """One object of the inventory: what it is, where it is, and what the conversion did with it."""

    kind: str  # model | optimizer | scheduler | dataloader | batches | metric | file write
    name: str
    line: int
    action: str


@dataclass
class Report:
    changes: list[Change] = field(default_factory=list)
    left_alone: list[LeftAlone] = field(default_factory=list)
    status: str = "converted"  # converted | unchanged | already-accelerate | trainer
    problems: list[Problem] = field(default_factory=list)
    found: list[Found] = field(default_factory=list)
    iteration_based: bool = False  # training draws random batches (no epochs): progress is counted in steps
    advice: str = ""  # status "trainer": the one line saying how to launch the script as it is
    evaluation_loops: list[int] = field(default_factory=list)  # lines of loops over a loader that do not train
    evaluation_every: list[int] = field(default_factory=list)  # N of evaluations run every N training steps

    def change(self, line: int, what: str, why: str) -> None:
        self.changes.append(Change(line, _shorten(what), why))

    def problem(self, line: int, what: str, todo: str) -> None:
        self.problems.append(Problem(line, _shorten(what), todo))

    def found_item(self, kind: str, name: str, line: int, action: str) -> None:
        self.found.append(Found(kind, name, line, action))

    def leave(self, line: int, why: str, todo: str) -> None:
        self.left_alone.append(LeftAlone(line, _shorten(why), todo))

    def sorted(self) -> Report:
        return Report(sorted(self.changes, key=lambda c: c.line), sorted(self.left_alone, key=lambda n: n.line),
                      self.status, sorted(self.problems, key=lambda p: p.line),
                      sorted(self.found, key=lambda f: (f.line, f.kind)), self.iteration_based, self.advice,
                      sorted(self.evaluation_loops), sorted(self.evaluation_every))

    def format(self, script: str = "script") -> str:
        if self.status == "already-accelerate":
            return f"{script}: already uses Accelerate (it creates its own Accelerator); nothing to convert."
        if self.status == "trainer":
            return self.advice
        ordered = self.sorted()
        lines: list[str] = []
        if ordered.found:
            lines.append(f"{script}: what it found ({len(ordered.found)}):")
            width = max(len(f.kind) for f in ordered.found)
            for item in ordered.found:
                name = f" `{item.name}`" if item.name else ""
                lines.append(f"  {_where(item.line)}  {item.kind:<{width}}{name}: {item.action}")
        if ordered.changes:
            lines.append(f"{script}: {len(ordered.changes)} change(s):")
            lines += [f"  {_where(c.line)}  {c.what}\n{'':10}why: {c.why}" for c in ordered.changes]
        elif not ordered.problems:  # refused with nothing else to change: the problems below say why
            lines.append(f"{script}: nothing to convert.")
        if ordered.left_alone:
            lines.append(f"Left as it is ({len(ordered.left_alone)}):")
            lines += [f"  {_where(n.line)}  {n.why}\n{'':10}to do: {n.todo}" for n in ordered.left_alone]
        if ordered.problems:
            lines.append(f"NOT CONVERTED ({len(ordered.problems)}): until these are fixed the script does not train "
                         "the same model on several processes:")
            lines += [f"  {_where(p.line)}  {p.what}\n{'':10}to do: {p.todo}" for p in ordered.problems]
        return "\n".join(lines)


def partial_line(problems: list[Problem]) -> str:
    """The last line of a conversion written with problems left (--partial): what is not done, never 'converted'."""
    first = min(problems, key=lambda p: p.line)
    more = f" (and {len(problems) - 1} more, listed above)" if len(problems) > 1 else ""
    return f"partial: {first.where()}{more}"


def _where(line: int) -> str:
    return f"{'line ' + str(line) if line else 'file':<8}"
