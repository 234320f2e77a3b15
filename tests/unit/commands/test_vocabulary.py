"""One vocabulary across commands: every old spelling (and old value) still works and means what the canonical one
means, --help shows only the canonical spelling, and the script's arguments and the launcher options read alike in
every command that runs a script."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from accelkit.cli import COMMANDS, cli
from accelkit.command_result import CommandResult
from accelkit.commands.vocabulary import ALIASES, VALUE_ALIASES, AliasOption, hidden_spellings


def _command(name: str) -> click.Command:
    return importlib.import_module(f"accelkit.commands.{COMMANDS[name]}").command


def _target(command: click.Command, flag: str) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and flag in p.opts
                and not isinstance(p, AliasOption))


def _sample(option: click.Option) -> list[str]:
    """A valid value for the option, as words (none for a flag)."""
    if option.is_flag:
        return []
    if isinstance(option.type, click.Choice):
        return [str(option.type.choices[-1])]
    if "rdzv_conf" in option.name:
        return ["join_timeout=900"]
    if isinstance(option.type, click.Path):
        return ["some.yaml"]
    numeric = (click.INT, click.FLOAT) + (click.IntRange, click.FloatRange)  # type: ignore[operator]
    return ["2"] if option.type in numeric[:2] or isinstance(option.type, numeric[2:]) else ["v"]


def _params(name: str, args: list[str], tmp_path: Path) -> dict:
    """What the command's callback would receive for ARGS (parsed only: nothing runs)."""
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    leading = {"launch": [], "bench": [], "convert": []}.get(name)
    trailing = [str(script)] if leading is not None else []
    with _command(name).make_context(name, [*args, *trailing]) as ctx:
        return dict(ctx.params)


ALIAS_CASES = [(name, alias) for name, aliases in ALIASES.items() for alias in aliases]


@pytest.mark.parametrize(("name", "alias"), ALIAS_CASES, ids=[f"{n}:{a.spelling}" for n, a in ALIAS_CASES])
def test_every_old_spelling_means_the_canonical_one(name: str, alias, tmp_path: Path) -> None:
    command = _command(name)
    target = _target(command, alias.canonical)
    value = _sample(target)
    assert _params(name, [alias.spelling, *value], tmp_path) == _params(name, [alias.canonical, *value], tmp_path)
    assert alias.spelling in hidden_spellings(command)


VALUE_CASES = [(name, alias.spelling, old, new) for name, aliases in ALIASES.items() for alias in aliases
               for old, new in {**VALUE_ALIASES.get(alias.canonical, {}), **alias.values}.items()]
VALUE_CASES += [(name, flag, old, new) for name in COMMANDS for flag, values in VALUE_ALIASES.items()
                for old, new in values.items() if any(flag in p.opts for p in _command(name).params)]


@pytest.mark.parametrize(("name", "flag", "old", "new"), VALUE_CASES,
                         ids=[f"{n}:{f}={o}" for n, f, o, _ in VALUE_CASES])
def test_every_old_value_means_the_canonical_one(name: str, flag: str, old: str, new: str, tmp_path: Path) -> None:
    canonical = next(a.canonical for a in ALIASES.get(name, ()) if a.spelling == flag) \
        if flag not in VALUE_ALIASES else flag
    assert _params(name, [flag, old], tmp_path) == _params(name, [canonical, new], tmp_path)


def _shown(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


@pytest.mark.parametrize("name", list(COMMANDS))
def test_help_shows_one_spelling(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"], prog_name="accelkit")
    assert result.exit_code == 0, result.output
    for spelling in hidden_spellings(_command(name)):
        assert not _shown(result.output, spelling), f"{spelling} is shown in `accelkit {name} --help`"
    for flag, values in VALUE_ALIASES.items():
        for listed in re.findall(rf"{flag} \[([^\]]*)\]", result.output):  # the choices --help lists
            assert not set(values) & set(listed.split("|")), f"{flag} [{listed}] in `accelkit {name} --help`"
    for alias in ALIASES.get(name, ()):
        assert _shown(result.output, alias.canonical)


def test_plan_reads_the_same_under_old_and_new_spellings(monkeypatch: pytest.MonkeyPatch) -> None:
    import accelkit.plan

    def plan(*args: str) -> dict:
        """What `accelkit plan ARGS` hands the planner (the planner itself is tested in tests/unit/plan)."""
        received: dict = {}

        def run_plan(request):
            received.update(vars(request))
            return CommandResult()

        monkeypatch.setattr(accelkit.plan, "run_plan", run_plan)
        result = CliRunner().invoke(cli, ["plan", "--params", "7B", *args])
        assert result.exit_code == 0, result.output
        return received

    old = plan("--gpus", "4", "--nodes", "2", "--precision", "fp16-mixed")
    assert old == plan("--num-processes", "4", "--num-machines", "2", "--mixed-precision", "fp16")
    assert (old["gpus"], old["nodes"], old["precision"]) == (4, 2, "fp16-mixed")
    assert old["command_line"] == ("accelkit plan --params 7B --num-processes 4 --num-machines 2 "
                                   "--mixed-precision fp16")  # a written config's header speaks the new words
    # `plan --precision bf16` was pure bf16; under --mixed-precision, bf16 is Accelerate's mixed bf16
    assert plan("--precision", "bf16")["precision"] == plan("--mixed-precision", "bf16-true")["precision"] == "bf16"
    assert plan("--mixed-precision", "bf16")["precision"] == plan()["precision"] == "bf16-mixed"


def test_every_plan_flag_is_a_field_of_the_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each option of `accelkit plan` lands in one field of PlanRequest, the shape flags in its one ShapeFlags."""
    import dataclasses

    import accelkit.plan
    from accelkit.plan import PlanRequest, ShapeFlags

    shape_fields = {f.name for f in dataclasses.fields(ShapeFlags)}
    request_fields = {f.name for f in dataclasses.fields(PlanRequest)}
    options = {p.name for p in _command("plan").params if not isinstance(p, AliasOption)}
    assert options == (request_fields | shape_fields) - {"shape", "script_args", "command_line"}
    assert not shape_fields & request_fields

    received: list = []
    monkeypatch.setattr(accelkit.plan, "run_plan", lambda request: received.append(request) or CommandResult())
    flags = ["--layers", "2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--vocab", "100",
             "--intermediate", "128"]
    result = CliRunner().invoke(cli, ["plan", *flags, "--num-processes", "2"])
    assert result.exit_code == 0, result.output
    assert received[0].shape == ShapeFlags(layers=2, hidden=64, heads=4, kv_heads=2, vocab=100, intermediate=128)
    assert (received[0].model, received[0].params, received[0].gpus) == (None, None, 2)
    assert PlanRequest().shape == ShapeFlags()  # the command's default: no shape flag given


def test_an_alias_and_its_option_disagreeing_is_refused(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, ["plan", "--params", "7B", "--gpus", "2", "--num-processes", "4"])
    assert result.exit_code == 1
    assert result.stderr.splitlines()[0] == "Error: --gpus 2 and --num-processes 4 disagree"
    assert "another spelling of --num-processes" in result.stderr
    assert _params("plan", ["--gpus", "2", "--num-processes", "2"], tmp_path)["gpus"] == 2  # agreeing is fine


@pytest.mark.parametrize(("name", "args", "script_args"), [
    ("launch", ["{script}", "--lr", "1"], ("--lr", "1")),
    ("launch", ["{script}", "--", "--lr", "1"], ("--lr", "1")),
    ("launch", ["--cpu", "--", "{script}", "--x"], ("--x",)),
    ("launch", ["{script}", "--lr", "1", "--", "--x"], ("--lr", "1", "--", "--x")),  # the script's own `--`
    ("bench", ["{script}", "--", "--steps", "3"], ("--steps", "3")),
    ("bench", ["{script}", "--steps", "3"], ("--steps", "3")),
    ("convert", ["--check", "{script}", "--lr", "0.1"], ("--lr", "0.1")),
    ("convert", ["--check", "{script}", "--", "--steps", "5"], ("--steps", "5")),
    ("plan", ["--params", "1M", "--measure", "{script}", "--", "--steps", "5", "--", "x"], ("--steps", "5", "--", "x")),
    ("plan", ["--params", "1M"], ()),
])
def test_script_arguments_read_one_way(name: str, args: list[str], script_args: tuple, tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    words = [str(script) if word == "{script}" else word for word in args]
    with _command(name).make_context(name, words) as ctx:
        assert ctx.params["script_args"] == script_args
        assert ctx.params.get("steps") in (None, 8, 20)  # the script's --steps never lands in the command's


@pytest.mark.parametrize("name", ["launch", "bench"])
@pytest.mark.parametrize(("args", "message"), [
    (["--rdzv-conf", "join_timeout"], "is not KEY=VALUE"),
    (["--rdzv-backend", "carrier-pigeon"], "Invalid value for '--rdzv-backend'"),
    (["--config", ""], "the path is empty"),
])
def test_launch_and_bench_check_their_launcher_options_alike(name: str, args: list[str], message: str,
                                                             tmp_path: Path) -> None:
    result = CliRunner().invoke(cli, [name, *args, str(tmp_path / "train.py")])
    assert result.exit_code == 2 and message in result.stderr, result.output



@pytest.mark.parametrize("name", list(ALIASES))
def test_each_command_page_lists_its_other_spellings(name: str) -> None:
    from helpers import REPO_ROOT

    page = (REPO_ROOT / "docs" / "commands" / f"{name}.md").read_text()
    section = page.split("## Other spellings", 1)[-1]
    for alias in ALIASES[name]:
        assert f"`{alias.spelling}`" in section, f"docs/commands/{name}.md does not list {alias.spelling}"
        for old in alias.values:
            assert f"`{old}`" in section
    for flag, values in VALUE_ALIASES.items():
        if any(flag in p.opts for p in _command(name).params):
            assert all(f"`{old}`" in section for old in values), f"docs/commands/{name}.md: {flag}'s old values"
