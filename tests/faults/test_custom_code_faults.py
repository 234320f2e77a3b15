"""A model folder's own code never runs: every command that reads a transformers config.json (plan: a folder, a
config.json; merge-ckpt: the config beside a checkpoint) meets one whose `auto_map` points at Python files that
would write a marker file when imported. The marker never appears, whatever stdin says (a "y" waits there for a
prompt that must not come); plan refuses in one line naming the auto_map entry; merge-ckpt merges the weights,
copies the config as it is and says in one line that the ties come from the checkpoint only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.faults import run_fault

MEMORY = ["--gpus", "1", "--gpu-memory", "80GB"]


def hostile_folder(folder: Path, marker: Path, *, nested: bool = False, model_type: str = "evil") -> Path:
    """config.json + configuration_evil.py + modeling_evil.py; importing either writes `marker`."""
    folder.mkdir(parents=True, exist_ok=True)
    auto_map = {"AutoConfig": "configuration_evil.EvilConfig", "AutoModelForCausalLM": "modeling_evil.EvilModel"}
    config: dict = {"model_type": model_type, "architectures": ["EvilModel"], "hidden_size": 64,
                    "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 128}
    if nested:  # a multimodal-style config with the custom code in its text part
        config["text_config"] = {"model_type": "evil_text", "auto_map": auto_map}
    else:
        config["auto_map"] = auto_map
    (folder / "config.json").write_text(json.dumps(config))
    payload = f"open({str(marker)!r}, 'w').write('the folder code ran')\n"
    (folder / "configuration_evil.py").write_text(payload + "from transformers import PretrainedConfig\n"
                                                  "class EvilConfig(PretrainedConfig):\n    model_type = 'evil'\n")
    (folder / "modeling_evil.py").write_text(payload)
    return folder


@pytest.mark.parametrize("case, entry", [
    ("folder", r"auto_map AutoConfig: configuration_evil\.EvilConfig"),
    # the other cases in the slow suite: each plan imports transformers in a fresh interpreter (3 s of CPU)
    pytest.param("config.json", r"auto_map AutoConfig: configuration_evil\.EvilConfig", marks=pytest.mark.slow),
    pytest.param("nested", r"text_config\.auto_map AutoConfig: configuration_evil\.EvilConfig",
                 marks=pytest.mark.slow),
    pytest.param("native type", r"auto_map AutoConfig: configuration_evil\.EvilConfig",  # a type transformers knows
                 marks=pytest.mark.slow),
])
def test_plan_refuses_custom_code_and_never_runs_it(tmp_path: Path, case: str, entry: str) -> None:
    marker = tmp_path.parent / f"{tmp_path.name}-marker"  # outside the watched tree: looked for on its own
    folder = hostile_folder(tmp_path / "model", marker, nested=case == "nested",
                            model_type="llama" if case == "native type" else "evil")
    target = folder / "config.json" if case == "config.json" else folder
    result = run_fault(["plan", str(target), *MEMORY], watch=[tmp_path], cwd=tmp_path, stdin="y\ny\n",
                       env={"HF_HOME": str(tmp_path.parent / f"{tmp_path.name}-hf")})
    line = result.assert_refused(rf"names custom code \({entry}.*\), which accelkit never runs")
    assert not marker.exists(), "the model folder's code ran"
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr, "transformers prompted"
    assert "--layers" in result.stderr  # the hint: a way to plan without the folder's code
    if case == "native type":
        assert "without auto_map" in result.stderr
    assert line.count("Error:") == 1


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.slow  # makes a DCP checkpoint and runs a real merge (torch import in the subprocess)
def test_merge_copies_a_custom_code_config_without_running_it(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    run = tmp_path / "run"
    marker = tmp_path.parent / f"{tmp_path.name}-marker"
    hostile_folder(run, marker)
    state = {"model.embed_tokens.weight": torch.randn(128, 64), "lm_head.weight": torch.randn(128, 64)}
    dcp.save(state, checkpoint_id=str(run / "checkpoint-1" / "pytorch_model_fsdp_0"))
    out = tmp_path / "merged"
    result = run_fault(["merge-ckpt", str(run / "checkpoint-1" / "pytorch_model_fsdp_0"), "-o", str(out)],
                       watch=[tmp_path], stdin="y\ny\n", expect="ok", kind="custom code")
    assert result.returncode == 0, result.stderr[-2000:]
    result.assert_clean(owned=[out])
    assert not marker.exists(), "the model folder's code ran"
    said = [line for line in (result.stdout + result.stderr).splitlines() if "custom code" in line]
    assert len(said) == 1 and "auto_map AutoConfig: configuration_evil.EvilConfig" in said[0], said
    assert json.loads((out / "config.json").read_text())["auto_map"]  # copied as it is, not run
