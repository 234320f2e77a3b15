"""`accelkit plan` on the command line: JSON for machines, a config written through `accelkit config`'s builder,
the command's choices in step with the library, MODEL from a local config, a project or a bare count."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from accelkit.cli import cli
from accelkit.commands import plan as plan_command
from accelkit.plan.catalog import STRATEGIES
from accelkit.plan.inputs import OPTIMIZERS, PRECISIONS

TINY = ["--layers", "2", "--hidden", "128", "--heads", "4", "--vocab", "512", "--seq-len", "64"]


def run(*args: str):
    return CliRunner().invoke(cli, ["plan", *args], catch_exceptions=False)


def test_choices_are_the_library_s() -> None:
    assert tuple(s.name for s in STRATEGIES) == plan_command.STRATEGY_NAMES
    assert tuple(plan_command.PRECISIONS.values()) == PRECISIONS and plan_command.OPTIMIZERS == OPTIMIZERS


def test_json_output(tmp_path: Path) -> None:
    result = run(*TINY, "--gpus", "2", "--gpu-memory", "24GiB", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    mlp = 512  # Llama's 8h/3 rounded up to a multiple of 256
    assert data["model"]["parameters"] == 2 * (4 * 128 * 128 + 3 * 128 * mlp + 2 * 128) + 128 + 2 * 512 * 128
    assert [s["name"] for s in data["strategies"]] == [s.name for s in STRATEGIES]
    assert data["recommendation"]["strategy"] == "ddp"
    assert data["hardware"]["gpu_memory_bytes"] == 24 * 2**30


def test_write_config_goes_through_the_config_builder(tmp_path: Path) -> None:
    from accelkit.configs.files import check_config

    out = tmp_path / "zero.yaml"
    result = run("--params", "7B", "--gpus", "8", "--gpu-memory", "80GB", "--strategy", "zero3", "--global-batch",
                 "32", "--write-config", str(out))
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert text.startswith("# Written by: accelkit plan --params 7B --num-processes 8 --gpu-memory 80GB "
                           "--global-batch 32 --strategy zero3 --write-config")
    assert "zero_stage: 3" in text and "num_processes: 8" in text and "gradient_accumulation_steps: 4" in text
    assert not [f for f in check_config(out) if f.severity == "error"]
    assert f"accelkit launch --config {out}" in result.output
    again = run("--params", "7B", "--gpus", "8", "--gpu-memory", "80GB", "--write-config", str(out))
    assert again.exit_code == 1 and "already exists" in again.output and out.read_text() == text


def test_a_local_config_and_a_bare_count(tmp_path: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=300, n_positions=128).save_pretrained(tmp_path / "gpt")
    from_dir = json.loads(run(str(tmp_path / "gpt"), "--gpu-memory", "8GiB", "--seq-len", "64", "--json").output)
    from_file = json.loads(run(str(tmp_path / "gpt" / "config.json"), "--gpu-memory", "8GiB", "--seq-len", "64",
                               "--json").output)
    assert from_dir["model"]["name"] == "GPT2LMHeadModel"
    assert from_dir["model"]["parameters"] == from_file["model"]["parameters"] > 0
    assert from_dir["recommendation"]["strategy"] == "single"  # one GPU by default without GPUs here
    counted = json.loads(run("--params", "1.3e9", "--gpus", "2", "--gpu-memory", "80GB", "--json").output)
    # a bare count is planned as the Llama shape of that size, named in the output
    assert abs(counted["model"]["parameters"] / 1_300_000_000 - 1) < 1e-4 and counted["model"]["exact"] is True
    assert "planned as a Llama shape" in counted["model"]["source"]
    assert "traced on the meta device" in counted["activations"]["torch"]["source"]


@pytest.mark.parametrize("content, match", [
    ("{not json", "is not valid JSON"),
    (json.dumps({"model_type": "my_custom", "architectures": ["MyCustomForCausalLM"],
                 "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyCustomForCausalLM"}}),
     "names custom code (auto_map AutoModelForCausalLM: modeling_custom.MyCustomForCausalLM)"),
    (json.dumps({"model_type": "llama", "architectures": ["MyLlamaForCausalLM"],
                 "auto_map": {"AutoModelForCausalLM": "modeling_custom.MyLlamaForCausalLM"}}),
     "which accelkit never runs"),
])
def test_configs_that_cannot_be_planned(tmp_path: Path, content: str, match: str) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(content)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = run(str(tmp_path / "model"), "--gpus", "1", "--gpu-memory", "80GB")
    assert result.exit_code == 1 and match in result.output and "Hint:" in result.output
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("signum, said, code", [(signal.SIGINT, "Interrupted.", 130),
                                                (signal.SIGTERM, "Terminated (signal 15).", 143)])
def test_a_measured_run_stopped_by_a_signal_says_which(signum: int, said: str, code: int) -> None:
    """`plan --measure` raises Terminated(status - 128) when its launch was stopped: Ctrl-C (SIGINT) is an
    interruption (exit 130), not "Terminated (signal 2)". In its own interpreter: a stopped command exits at once."""
    program = textwrap.dedent(f"""
        import accelkit.plan.api
        from accelkit.cli import main
        from accelkit.errors import Terminated

        def stopped(*_, **__):
            raise Terminated({int(signum)})

        accelkit.plan.api.run_plan = stopped
        main(["plan", "--params", "7B", "--gpus", "2", "--gpu-memory", "80GB"])
    """)
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert result.returncode == code, result.stderr
    assert result.stderr.strip().splitlines() == [said]


def test_a_config_missing_some_sizes_is_planned_with_a_note_naming_the_defaults(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "intermediate_size": 128, "max_position_embeddings": 256}))
    result = run(str(tmp_path / "model"), "--gpus", "1", "--gpu-memory", "80GB", "--seq-len", "128")
    assert result.exit_code == 0
    assert "Note: config.json does not give vocab_size: LlamaConfig's defaults are used (vocab_size 32000)" \
        in result.output


def test_custom_code_is_found_at_any_depth_and_named() -> None:
    from accelkit.hfmodel import custom_code_entry, describe_error

    assert custom_code_entry({"model_type": "llama"}) is None
    assert custom_code_entry({"auto_map": {"AutoTokenizer": ["tok.Slow", None]}}) == "auto_map AutoTokenizer: tok.Slow"
    assert custom_code_entry({"vision_config": {"text": {"auto_map": {"AutoModel": "m.M"}}}}) == \
        "vision_config.text.auto_map AutoModel: m.M"
    error = ValueError("Validation error for field 'x':\n    TypeError: Field 'x' expected int, got str")
    assert describe_error(error) == "Field 'x' expected int, got str"


MEMORY = ["--gpu-memory", "80GB", "--gpus", "1"]


@pytest.mark.parametrize("args, config, match, hint", [
    (["--params", "7B", "--gpu-memory", "80GB", "--gpus", "4", "--strategy", "fsdp-hybrid"], None,
     r"needs --num-machines 2 or more", "fsdp-full"),
    (["--params", "7B", *MEMORY, "--strategy", "zero2"], None, r"ZeRO-2 on 1 GPU shards nothing .* no memory saved",
     "zero3-offload"),
    (["--params", "7B", "--gpu-memory", "80GB", "--gpus", "4", "--micro-batch", "2", "--global-batch", "20"], None,
     r"--global-batch 20 is not a whole number of steps of 8 samples .* accumulation would be 2\.5", "16 or 24"),
    (MEMORY, {"model_type": "llama"}, r"gives none of hidden_size, num_hidden_layers, num_attention_heads, "
                                      r"vocab_size: transformers would fill them with LlamaConfig's defaults",
     "--params"),
    ([*MEMORY, "--seq-len", "256"],
     {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300, "n_positions": 128},
     r"--seq-len 256 is beyond the model's max_position_embeddings 128", "--seq-len 128"),
    (MEMORY, {"model_type": "llama", "hidden_size": "big"},
     r"config.json: Field 'hidden_size' expected int, got str \(value: 'big'\)$", "fix that field"),
    (MEMORY, {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 7},
     r"The hidden size \(64\) is not a multiple of the number of attention heads \(7\)", "fix that field"),
], ids=["hybrid-on-one-node", "zero2-on-one-gpu", "uneven-global-batch", "no-sizes", "seq-len", "field-type",
        "heads"])
def test_refusals_that_need_the_model_in_process(tmp_path: Path, args: list[str], config: dict | None, match: str,
                                                  hint: str) -> None:
    """The refusals that come after the model is built, through main() in this process (the fast loop); the same
    cases as real processes under the whole fault contract: tests/faults/test_plan_faults.py (slow: each builds
    the model with transformers in a fresh interpreter)."""
    import re

    from helpers import invoke_accelkit

    if config is not None:
        (tmp_path / "model").mkdir()
        (tmp_path / "model" / "config.json").write_text(json.dumps(config))
        args = [str(tmp_path / "model"), *args]
    before = sorted(tmp_path.rglob("*"))
    result = invoke_accelkit("plan", *args, cwd=tmp_path)
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert result.returncode == 1 and len(errors) == 1 and re.search(match, errors[0]), result.stderr
    assert hint in result.stderr and "Traceback" not in result.stderr
    assert sorted(tmp_path.rglob("*")) == before
