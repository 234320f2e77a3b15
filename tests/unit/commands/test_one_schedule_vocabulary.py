"""One schedule vocabulary and one micro-batch rule set (issue 46, item 3): `accelkit config`, `launch`, `bench` and
`plan` accept and refuse every schedule spelling and every micro-batch count alike, in the same words
(accelkit.pipeline_schedules). Each command is driven through its own command line, in process, up to the point
where it would start work: config writes its file, launch --dry-run prints its command, bench stops right after
checking every launch, plan's --layout is parsed as its command does first (accepted layouts are not planned:
seconds each); plan's refusals go through its command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from accelkit.cli import cli
from accelkit.commands.config_options import PipelineSchedule
from accelkit.errors import AccelkitError
from accelkit.pipeline_schedules import MAX_MICROBATCHES, SCHEDULES, microbatch_rule_break, parse_schedule
from accelkit.plan.layout_option import parse_layout_option

PP = 4
COUNTS = (0, 1, PP - 1, PP, PP + 1, 2 * PP, MAX_MICROBATCHES, MAX_MICROBATCHES + 1, 100_000)
# every spelling each schedule is accepted in: configs' name, torch's, upper case, with a dash
SPELLINGS = [(s.name, spelled) for s in SCHEDULES for spelled in
             dict.fromkeys((s.name, s.torch_name, s.name.upper(), s.torch_name.replace("1F1B", "-1F1B")))]


class Checked(Exception):
    """Raised where bench would start its first run: everything before it passed."""


@pytest.fixture(scope="module")
def script(tmp_path_factory) -> Path:
    """A script with pipeline code (launch refuses a pp layout on one that never reads $ACCELKIT_PIPELINE)."""
    path = tmp_path_factory.mktemp("script") / "train.py"
    path.write_text("import os\nLAYOUT = os.environ.get('ACCELKIT_PIPELINE')\n")
    return path


def error_line(output: str) -> str | None:
    return next((line.removeprefix("Error: ") for line in output.splitlines() if line.startswith("Error: ")), None)


def verdicts(schedule: str, microbatches: int, script: Path, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> dict[str, str | None]:
    """command -> None (accepted) or its one error line (bench's without the `--layouts L (backend): ` it names the
    layout with)."""
    runner = CliRunner()
    pipeline = ["--pp-schedule", schedule, "--microbatches", str(microbatches)]
    layout = ["--backend", "ddp", "--num-processes", str(PP), "--pp-size", str(PP), *pipeline]
    out: dict[str, str | None] = {}
    config = runner.invoke(cli, ["config", *layout, "-o", str(tmp_path / "pp.yaml"), "--force"])
    out["config"] = error_line(config.output) if config.exit_code else None
    launch = runner.invoke(cli, ["launch", "--cpu", "--dry-run", *layout, str(script)])
    out["launch"] = error_line(launch.output) if launch.exit_code else None

    import accelkit.bench.api as bench_api

    def stop(*args, **kwargs):
        raise Checked

    monkeypatch.setattr(bench_api, "threads_per_rank", stop)
    bench = runner.invoke(cli, ["bench", "--cpu", "--backend", "ddp", "--layouts", f"pp={PP}", *pipeline,
                                "-o", str(tmp_path / "bench"), "--force", str(script)])
    if isinstance(bench.exception, Checked):
        out["bench"] = None
    else:
        said = error_line(bench.output)
        assert said is not None, bench.output
        out["bench"] = said.removeprefix(f"--layouts pp={PP} (ddp): ")

    try:  # plan's first step on --layout, after click has read --pp-schedule
        parse_layout_option(f"pp={PP}", PipelineSchedule().convert(schedule, None, None), microbatches)
        out["plan"] = None
    except AccelkitError:
        plan = runner.invoke(cli, ["plan", "--layers", "8", "--hidden", "64", "--heads", "4", "--gpu-memory", "80GB",
                                   "--layout", f"pp={PP}", *pipeline])
        assert plan.exit_code == 1, plan.output
        out["plan"] = error_line(plan.output)
    return out


@pytest.mark.parametrize("microbatches", COUNTS)
@pytest.mark.parametrize("schedule", [s.name for s in SCHEDULES])
def test_every_command_judges_a_microbatch_count_alike(schedule: str, microbatches: int, script: Path,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = microbatch_rule_break(PP, schedule, microbatches)
    expected = None if broken is None else broken.message
    assert verdicts(schedule, microbatches, script, tmp_path, monkeypatch) == dict.fromkeys(
        ("config", "launch", "bench", "plan"), expected)
    # the rules themselves: at least pp, at most the ceiling, a multiple of pp for the interleaved schedules
    interleaved = parse_schedule(schedule).interleaved
    accepted = PP <= microbatches <= MAX_MICROBATCHES and not (interleaved and microbatches % PP)
    assert (broken is None) == accepted


@pytest.mark.parametrize(("name", "spelled"), SPELLINGS, ids=[spelled for _, spelled in SPELLINGS])
def test_every_command_takes_every_spelling(name: str, spelled: str, script: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    assert verdicts(spelled, 2 * PP, script, tmp_path, monkeypatch) == dict.fromkeys(
        ("config", "launch", "bench", "plan"))
    # config writes the one name configs carry, whatever the spelling
    assert f"schedule={name}," in (tmp_path / "pp.yaml").read_text()


def test_every_command_refuses_an_unknown_schedule_alike(script: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    said = verdicts("zigzag", 2 * PP, script, tmp_path, monkeypatch)
    assert set(said.values()) == {"--pp-schedule 'zigzag' is not a pipeline schedule"}, said
    assert not (tmp_path / "pp.yaml").exists() and not (tmp_path / "bench").exists()
