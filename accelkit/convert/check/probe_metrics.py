"""Which numbers of a line printed by the *caller* of an evaluation are the evaluation's (probe side).

`val = evaluate(model, loader); print(f"epoch {epoch} train {train_loss:.4f} val {val.loss:.4f}")`: the line mixes
figures of the training (which legitimately differ between 1 and N processes) with the evaluation's (which must
not, at equal weights). The probe tells them apart by where the values live: when the evaluation pass starts it
notes the numbers its callers already hold (the epoch, the training loss); when a caller prints after the pass, a
printed number is the evaluation's when it shows a value one of the printing function's variables holds now (the
returned result, a dict, a dataclass, a 0-d tensor) that none of them held before the pass. Numbers computed inside
the print itself (`math.exp(val)`) show no variable: they are not compared (what they are made of is).

Imports nothing heavy: the checking side reads NUMBER and `shows` too.
"""

from __future__ import annotations

import itertools
import math
import re

NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
MAX_VALUES = 2_000  # numbers read from one frame's variables at most (a history list grows with the epochs)


class CallerMetrics:
    def __init__(self) -> None:
        self.before: list[float] = []  # numbers the callers held when the evaluation pass started

    def pass_started(self, frames: list) -> None:
        """`frames`: the user's frames on the stack when a loader pass starts, innermost (the loop's) first."""
        values: list[float] = []
        for frame in frames[1:]:
            values += numbers_in(frame.f_locals)
        self.before = values

    def positions(self, text: str, frame) -> list[int] | None:
        """Indexes (among NUMBER matches of `text`) of the evaluation's numbers in a line printed by `frame` (the
        checking side uses them for lines of the evaluating function's callers only)."""
        if frame is None:
            return []
        new = [v for v in numbers_in(frame.f_locals) if not any(v == b for b in self.before)]
        found = []
        for i, match in enumerate(NUMBER.finditer(text)):
            shown = match.group()
            if any(shows(shown, v) for v in new) and not any(shows(shown, b) for b in self.before):
                found.append(i)
        return found


def numbers_in(namespace: dict) -> list[float]:
    values: list[float] = []
    for name, value in namespace.items():
        if not name.startswith("__"):
            _collect(value, values, 0)
        if len(values) >= MAX_VALUES:
            break
    return values[:MAX_VALUES]


def _collect(value, out: list[float], depth: int) -> None:
    if len(out) >= MAX_VALUES or isinstance(value, (str, bytes, bool)) or value is None:
        return
    if isinstance(value, (int, float)):
        out.append(float(value))
        return
    if type(value).__module__.startswith("torch") or type(value).__module__.startswith("numpy"):
        numel = getattr(value, "numel", None)
        size = numel() if callable(numel) else getattr(value, "size", 0)
        if size == 1 and hasattr(value, "item"):
            out.append(float(value.item()))
        return  # modules, tensors of many values, optimizers: not a printed metric
    if depth >= 3:
        return
    # the last 64 items of a container at most (a history list grows: its latest entries are this epoch's)
    if isinstance(value, dict):
        for item in itertools.islice(reversed(value.values()), 64):
            _collect(item, out, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value[-64:]:
            _collect(item, out, depth + 1)
    elif hasattr(value, "__dataclass_fields__") or type(value).__name__ == "SimpleNamespace":
        fields = getattr(value, "__dict__", None) or {k: getattr(value, k, None) for k in
                                                      getattr(value, "__dataclass_fields__", {})}
        for item in list(fields.values())[:64]:
            _collect(item, out, depth + 1)


def shows(text: str, value: float) -> bool:
    """`text` (a printed number) is `value` as printed: equal to the digits shown (`0.6128` shows 0.61283...)."""
    try:
        number = float(text)
    except ValueError:
        return False
    if not math.isfinite(value):
        return False
    mantissa = text.lower().split("e")[0]
    places = len(mantissa.split(".")[1]) if "." in mantissa else 0
    if "e" in text.lower():
        return abs(number - value) <= 0.51 * 10 ** (-places) * abs(number) + 1e-300
    return abs(number - value) <= 0.51 * 10 ** (-places) + 1e-12 * abs(value)
