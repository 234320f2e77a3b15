"""The commands `accelkit plan` prints run as printed (issue 46, item 3): every `accelkit config` line writes a config
that `accelkit config --check` (Accelerate's loader) accepts, and every `accelkit launch` line passes launch's checks
(--dry-run), on one machine and on eight. On several machines the lines carry "$MAIN_PROCESS_IP" and
"$MACHINE_RANK", which the shell fills in on each machine: here as a POSIX shell does for a double-quoted word."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelkit.cli import cli

TINY = ["--layers", "4", "--hidden", "64", "--heads", "4", "--gpu-memory", "24GiB"]
PLANS = {
    "one machine": ["--num-processes", "2"],
    "eight machines": ["--num-processes", "64", "--num-machines", "8"],
    "pp layout, eight machines": ["--layout", "dp_shard=4,pp=2", "--pp-schedule", "Interleaved1F1B",
                                  "--num-machines", "8"],
}
SHELL = {"MAIN_PROCESS_IP": "10.0.0.1", "MACHINE_RANK": "3"}


def as_the_shell_runs(line: str) -> list[str]:
    """The words a shell passes for `line` (quotes removed, "$VAR" expanded), less the leading `accelkit`."""
    words = [os.path.expandvars(word) for word in shlex.split(line)]
    assert words[0] == "accelkit" and not any("$" in word for word in words), line
    return words[1:]


@pytest.mark.parametrize("plan_args", PLANS.values(), ids=PLANS.keys())
def test_every_printed_command_runs_as_printed(plan_args: list[str], tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for name, value in SHELL.items():
        monkeypatch.setenv(name, value)
    for script in ("your_script.py", "train.py"):  # the scripts the lines name, with pipeline code
        Path(script).write_text("import os\nLAYOUT = os.environ.get('ACCELKIT_PIPELINE')\n")
    runner = CliRunner()
    plan = runner.invoke(cli, ["plan", *TINY, *plan_args])
    assert plan.exit_code == 0, plan.output
    printed = [line.strip() for line in plan.output.splitlines() if line.strip().startswith("accelkit ")]
    configs = [line for line in printed if line.startswith("accelkit config ")]
    launches = [line for line in printed if line.startswith("accelkit launch ")]
    assert len(configs) == len(launches) == 1, plan.output
    several = "--num-machines" in plan_args
    assert ('"$MAIN_PROCESS_IP"' in configs[0]) == several and ('"$MACHINE_RANK"' in launches[0]) == several

    words = as_the_shell_runs(configs[0])
    written = runner.invoke(cli, words)
    assert written.exit_code == 0, (configs[0], written.output)
    config = Path(words[words.index("-o") + 1])
    checked = runner.invoke(cli, ["config", "--check", str(config)])
    assert checked.exit_code == 0 and "OK" in checked.output, checked.output
    if several:
        assert "main_process_ip: 10.0.0.1" in config.read_text()

    words = as_the_shell_runs(launches[0])
    dry = runner.invoke(cli, [words[0], "--dry-run", "--cpu", *words[1:]])
    assert dry.exit_code == 0, (launches[0], dry.output)
    if several:
        assert "--machine_rank 3 --main_process_ip 10.0.0.1" in dry.output
