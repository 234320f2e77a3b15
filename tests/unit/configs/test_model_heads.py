"""The model's attention heads read before any rank starts (issue 32 item 2): config.json as JSON, a script as
syntax; the upstream text quoted in one line (errors.clip)."""

from __future__ import annotations

import json
from pathlib import Path

from accelkit.configs.model_heads import heads_in_script, model_from_script_args, read_heads, tp_heads_problem
from accelkit.errors import clip


def test_heads_from_a_config_file_a_folder_and_a_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 32, "num_key_value_heads": 8}))
    assert read_heads(tmp_path) == read_heads(tmp_path / "config.json") == (32, 8)
    nested = tmp_path / "vlm.json"
    nested.write_text(json.dumps({"text_config": {"num_attention_heads": 12}}))
    assert read_heads(nested) == (12, 12)


def test_heads_from_the_config_a_script_builds(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("from transformers import LlamaConfig\n"
                      "config = LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2)\n")
    assert heads_in_script(script) == (4, 2)
    script.write_text("config = LlamaConfig(num_attention_heads=n)\n")
    assert heads_in_script(script) is None  # not a literal: unknown


def test_the_model_a_script_is_given_wins_over_its_own(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "train.py").write_text("")
    assert model_from_script_args(["--model", "m"], tmp_path, "train.py") == Path("m")
    assert model_from_script_args(["--model=org/hub-id"], tmp_path, "train.py") is None  # not local: unknown
    assert model_from_script_args([], tmp_path, "train.py") == Path("train.py")


def test_tp_heads_problem() -> None:
    assert tp_heads_problem(2, (4, 2)) is None
    message, hint = tp_heads_problem(4, (4, 2))
    assert "4 attention heads and 2 kv heads" in message and "(2)" in hint
    assert "no tp size splits them" in tp_heads_problem(2, (3, 1))[1]


def test_clip_ends_at_a_sentence_or_a_word() -> None:
    text = "DeepSpeed refused the config: train_batch_size is not the product of its parts. " + "It goes on " * 20
    assert clip(text, 120) == "DeepSpeed refused the config: train_batch_size is not the product of its parts. ..."
    words = clip("word " * 100, 50)
    assert words.endswith(" ...") and all(w == "word" for w in words[:-4].split())
    assert clip("short", 50) == "short"
