"""N-D layouts Accelerate cannot run (issue 22, item 1): one line with the reason before any rank starts, the same
words from `config --check` and `launch --config`, and nothing left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import run_fault

PROBE = DATA / "launch" / "probe.py"


@pytest.mark.parametrize(("flags", "words"), [
    (["--backend", "ddp", "--num-processes", "4", "--tp-size", "2"],
     r"--tp-size 2 with .*Accelerate does not compose DDP with tensor parallelism"),
    (["--backend", "fsdp", "--num-processes", "4", "--cp-size", "2"], r"context parallelism does not run on CPU"),
    (["--backend", "fsdp", "--num-processes", "4", "--dp-shard-size", "3"],
     r"the parallelism sizes \(dp_shard 3 = 3\) do not multiply to --num-processes 4"),
])
def test_launch_refuses_a_layout_before_any_rank_starts(flags: list[str], words: str, tmp_path: Path) -> None:
    result = run_fault(["launch", "--cpu", *flags, str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(words)


@pytest.mark.slow  # two CLI runs importing torch and accelerate; the rule itself: tests/unit/configs/test_nd_config.py
def test_check_and_launch_refuse_tp_across_machines_in_the_same_words(tmp_path: Path) -> None:
    config = tmp_path / "tp16.yaml"
    config.write_text("distributed_type: FSDP\nnum_processes: 16\nnum_machines: 2\nmachine_rank: 0\n"
                      "main_process_ip: 127.0.0.1\nfsdp_config:\n  fsdp_version: 2\nparallelism_config:\n"
                      "  parallelism_config_dp_shard_size: 1\n  parallelism_config_tp_size: 16\n")
    words = r"tensor-parallel groups of 16 processes would span machines \(8 per machine\)"
    check = run_fault(["config", "--check", str(config)], watch=[tmp_path])
    launch = run_fault(["launch", "--config", str(config), "--cpu", str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    assert check.assert_refused(words).split(": ", 2)[-1] == launch.assert_refused(words).split(": ", 2)[-1]


LOADS_WITH_DISTRIBUTED_CONFIG = """\
import sys
from accelerate import Accelerator
from transformers import LlamaForCausalLM
from transformers.distributed import DistributedConfig

accelerator = Accelerator()
model = LlamaForCausalLM.from_pretrained(sys.argv[1], distributed_config=DistributedConfig(tp_size=2))
"""


@pytest.mark.slow  # 4 gloo ranks importing transformers
def test_fsdp2_x_tp_script_loading_with_distributed_config_is_told_to_load_whole(tmp_path: Path) -> None:
    """transformers 5.1+'s DistributedConfig(tp_size=2) wants a mesh over all 4 processes of dp_shard 2 x tp 2: every
    rank fails in from_pretrained, and the launch says in one line how the model loads under FSDP2 x TP."""
    import subprocess
    import sys

    model = tmp_path / "tiny"
    subprocess.run([sys.executable, "-c", "from transformers import LlamaConfig, LlamaForCausalLM; "
                    "LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, "
                    "num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2))"
                    f".save_pretrained({str(model)!r})"], check=True, timeout=300)
    script = tmp_path / "train.py"
    script.write_text(LOADS_WITH_DISTRIBUTED_CONFIG)
    result = run_fault(["launch", "--cpu", "--backend", "fsdp", "--num-processes", "4", "--tp-size", "2",
                        str(script), str(model)], watch=[tmp_path], cwd=tmp_path, kind="user code")
    line = result.assert_refused(r"train\.py:7 \(`model = LlamaForCausalLM\.from_pretrained.*`\): transformers' "
                                 r"DistributedConfig builds its mesh over all 4 processes, but it was given 2 \(tp 2\)")
    assert "from_pretrained without distributed_config" in result.stderr, line
