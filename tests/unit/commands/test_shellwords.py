"""`accelkit.shellwords.command_line`: the one way a command is written back, and a command written back runs."""

from __future__ import annotations

import shlex
from pathlib import Path

from click.testing import CliRunner

from accelkit.cli import cli
from accelkit.configs import ConfigOptions
from accelkit.shellwords import command_line


def test_values_are_spelled_as_click_reads_them_back() -> None:
    line = command_line("accelkit", "config", flags=[("--wrap-cls", ("A", "B c")), ("--offload", False),
                                                     ("--cpu", True), ("--seed", 0), ("--none", None), ("--empty", ())],
                        args=[Path("t.py")], script_args=["--lr", "0.1"])
    assert line == "accelkit config --wrap-cls A --wrap-cls 'B c' --no-offload --cpu --seed 0 t.py -- --lr 0.1"


def test_plans_config_command_keeps_false_switches_and_every_repeated_value(tmp_path: Path) -> None:
    """`accelkit plan` recommends this command; run as printed, it writes the config the options describe (it used
    to drop `--no-...` switches and print a repeated option as `('A',)`)."""
    from accelkit.plan import spine

    out = tmp_path / "c.yaml"
    options = ConfigOptions(backend="fsdp", num_processes=2, wrap_cls=("GPT2Block", "LlamaDecoderLayer"),
                            cpu_ram_efficient_loading=False)
    line = spine.config_command(options, out)
    assert "--wrap-cls GPT2Block --wrap-cls LlamaDecoderLayer" in line and "--no-cpu-ram-efficient-loading" in line
    result = CliRunner().invoke(cli, shlex.split(line)[1:])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert "fsdp_transformer_layer_cls_to_wrap: GPT2Block,LlamaDecoderLayer" in text
    assert "fsdp_cpu_ram_efficient_loading: false" in text
