"""One command shape (issue 20): a command parses, calls one library function named for the command, prints what it
returns and exits with its code. The click functions stay short, and the printing is the same for all."""

from __future__ import annotations

import ast
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

import accelkit.commands
from accelkit.command_result import CommandResult
from accelkit.commands.printing import finish
from accelkit.errors import AccelkitError

COMMANDS = Path(accelkit.commands.__file__).parent
MAX_BODY_LINES = 30  # after the docstring: option checks, one library call, the printing


def command_bodies() -> dict[str, int]:
    """Lines of each click command function's body (after its docstring), by module."""
    bodies = {}
    for path in sorted(COMMANDS.glob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "command"
                    for d in node.decorator_list):
                body = node.body[1:] if isinstance(node.body[0], ast.Expr) else node.body
                bodies[path.stem] = node.end_lineno - body[0].lineno + 1
    return bodies


def test_every_command_body_is_a_few_lines_around_one_library_call() -> None:
    bodies = command_bodies()
    assert set(bodies) >= {"init", "config", "launch", "merge_ckpt", "convert", "plan", "bench", "env"}
    assert {name: lines for name, lines in bodies.items() if lines > MAX_BODY_LINES} == {}


def test_finish_prints_in_order_on_each_stream_then_raises_the_error() -> None:
    result = CommandResult(exit_code=3).out("table").err("note").out("yaml: 1\n", nl=False).out("end")

    @click.command()
    def show() -> None:
        raise SystemExit(finish(result))

    run = CliRunner().invoke(show, [])
    assert run.exit_code == 3
    assert (run.stdout, run.stderr) == ("table\nyaml: 1\nend\n", "note\n")
    assert run.output == "table\nnote\nyaml: 1\nend\n"  # the order it was said in

    failed = CommandResult().out("report")
    with failed.ends_on_error():
        raise AccelkitError("refused", hint="fix it")
    assert failed.error is not None and failed.error.message == "refused"
    with pytest.raises(AccelkitError, match="refused"):
        finish(failed)


def test_every_command_prints_a_command_result() -> None:
    """Each command hands what its library call returned to `finish` (plan, merge-ckpt and env printed their own
    types before issue 33): a command that echoes by itself is a second way of printing."""
    printers = {}
    for path in sorted(COMMANDS.glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and getattr(d.func, "attr", None) == "command"
                    for d in node.decorator_list):
                calls = {getattr(call.func, "id", getattr(call.func, "attr", None))
                         for call in ast.walk(node) if isinstance(call, ast.Call)}
                printers[path.stem] = "finish" in calls and "echo" not in calls
    assert {name for name, ok in printers.items() if not ok} == set()
