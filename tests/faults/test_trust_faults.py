"""Issue 32 ("Trust, round 3"): absurd sizes refused by a ceiling, refusals that name the rule that refused, the
tensor-parallel limits a rank dies of (checked where the model is known, explained from the real rank error where
it is not), offline Hub look-ups that fail at once, the config beside a cluster job that its own check accepts, and
hints that name the command the user ran. Each case: the exit code, one `Error:` line with a `Hint:`, no traceback,
nothing outside what the command owns created, changed or deleted."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault

PROBE = DATA / "launch" / "probe.py"
BIG = str(10**20)


def _model(folder: Path, **sizes: int) -> Path:
    """A config.json of a small Llama with `sizes` over the defaults (4 heads, 2 kv heads)."""
    folder.mkdir(parents=True, exist_ok=True)
    config = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "num_hidden_layers": 2, "intermediate_size": 128, "vocab_size": 1000, **sizes}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# -- item 3: every size has a ceiling a real machine could meet ----------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["--num-processes", BIG], r"--num-processes 100,000,000,000,000,000,000 is more than any cluster has "
                               r"\(the limit is 1,048,576\)"),
    (["--num-processes", str(2**20 + 8)], r"--num-processes 1,048,584 is more than any cluster has"),
    (["--backend", "ddp", "--num-processes", "8", "--num-machines", str(2**21)],
     r"--num-machines 2,097,152 is more than any cluster has"),
    (["--backend", "deepspeed", "--gradient-accumulation-steps", BIG], r"--gradient-accumulation-steps "
                                                                       r"100,000,000,000,000,000,000 is beyond"),
    (["--backend", "fsdp", "--wrap-policy", "size", "--min-num-params", BIG],
     r"--min-num-params 100,000,000,000,000,000,000 is more parameters than any model has"),
])
def test_config_sizes_beyond_any_machine_are_refused(args: list[str], words: str, tmp_path: Path) -> None:
    result = invoke_fault(["config", *args, "-o", str(tmp_path / "out.yaml")], watch=[tmp_path])
    result.assert_refused(words)


def test_config_check_refuses_a_file_with_absurd_processes(tmp_path: Path) -> None:
    config = tmp_path / "huge.yaml"
    config.write_text(f"distributed_type: MULTI_GPU\nnum_processes: {BIG}\nnum_machines: 1\nmachine_rank: 0\n")
    result = invoke_fault(["config", "--check", str(config)], watch=[tmp_path])
    result.assert_refused(r"num_processes 100,000,000,000,000,000,000 is more than any cluster has")


def test_launch_refuses_absurd_processes_before_any_rank(tmp_path: Path) -> None:
    result = invoke_fault(["launch", "--cpu", "--num-processes", BIG, str(PROBE)], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"--num-processes 100,000,000,000,000,000,000 is more than any cluster has")


@pytest.mark.parametrize(("args", "words"), [
    (["--seq-len", str(10**13)], r"--seq-len 10,000,000,000,000 is beyond any real run"),
    (["--micro-batch", str(10**13)], r"--micro-batch 10,000,000,000,000 is beyond any real run"),
    (["--global-batch", str(10**14)], r"--global-batch 100,000,000,000,000 is beyond any real run"),
    (["--cpu-memory", "2EiB"], r"--cpu-memory 2EiB is more than any machine holds"),
])
def test_plan_sizes_beyond_any_run_are_refused(args: list[str], words: str, tmp_path: Path) -> None:
    result = invoke_fault(["plan", "--params", "7B", "--gpu-memory", "80GB", "--gpus", "1", *args],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(words)


@pytest.mark.parametrize("size", ["2PiB", "3PB", "1EB"])
def test_plan_petabytes_are_a_size_beyond_any_gpu(size: str, tmp_path: Path) -> None:
    """Item 4: `2PiB` was "not a size"; it is one, and more than any GPU holds."""
    result = invoke_fault(["plan", "--params", "7B", "--gpus", "1", "--gpu-memory", size], watch=[tmp_path],
                          cwd=tmp_path)
    line = result.assert_refused(rf"--gpu-memory {size} is more than any GPU holds")
    assert "not a size" not in line


# -- item 4: the refusal names the rule that refused ---------------------------------------------------------------
@pytest.mark.parametrize(("args", "words"), [
    (["--backend", "fsdp", "--tp-size", "3", "--num-processes", "8"],
     r"--tp-size 3 does not divide --num-processes 8: --backend fsdp gives dp_shard the processes"),
    (["--backend", "ddp", "--tp-size", "3", "--num-processes", "8"],
     r"--tp-size 3 does not divide --num-processes 8: --backend ddp gives dp_replicate"),
    (["--backend", "fsdp", "--tp-size", "2", "--cp-size", "3", "--num-processes", "8"],
     r"--tp-size 2 x --cp-size 3 does not divide --num-processes 8"),
    (["--backend", "fsdp", "--cp-size", "5", "--num-processes", "8"], r"--cp-size 5 does not divide"),
])
def test_sizes_that_do_not_divide_the_processes_say_so(args: list[str], words: str, tmp_path: Path) -> None:
    """Item 4: `--tp-size 3` on 8 processes was refused with "leaves FSDP nothing to shard" (another rule's
    reason): the size the backend fills could not be filled, because 3 does not divide 8."""
    result = invoke_fault(["config", *args, "-o", str(tmp_path / "out.yaml")], watch=[tmp_path])
    line = result.assert_refused(words)
    assert "nothing to shard" not in line


@pytest.mark.parametrize(("sizes", "words"), [
    ({"hidden_size": -64}, r"config\.json: hidden_size is -64, which no model can have"),
    ({"num_key_value_heads": -2}, r"config\.json: num_key_value_heads is -2, which no model can have"),
    ({"num_attention_heads": 0}, r"config\.json: num_attention_heads is 0, which no model can have"),
    ({"vocab_size": -1}, r"config\.json: vocab_size is -1"),
    ({"hidden_size": 65}, r"hidden size \(65\) is not a multiple of the number of attention heads"),
])
def test_impossible_model_sizes_are_named_not_a_runtime_error(sizes: dict, words: str, tmp_path: Path) -> None:
    """Item 4: a negative hidden_size gave `Error: RuntimeError: Trying to create tensor with negative dimension`."""
    model = _model(tmp_path / "model", **sizes)
    result = invoke_fault(["plan", str(model), "--gpu-memory", "80GB", "--gpus", "1"], watch=[tmp_path],
                          cwd=tmp_path)
    line = result.assert_refused(words)
    assert "RuntimeError" not in line


@pytest.mark.parametrize("target", [["--slurm", "job.sbatch"], ["--kubernetes", "job.yaml", "--image", "img"],
                                    ["--skypilot", "job.yaml", "--accelerator", "H100"]])
def test_the_config_beside_a_cluster_job_passes_its_own_check(target: list[str], tmp_path: Path) -> None:
    """Item 4: the config written beside every cluster job says "Check with: accelkit config --check THIS_FILE",
    and that check refused it (no main_process_ip, which each node fills in at run time)."""
    (tmp_path / "train.py").write_text("print('hi')\n")
    written = invoke_fault(["launch", "--backend", "ddp", *target, "--num-machines", "2", "--gpus-per-node", "8",
                            "train.py"], watch=[tmp_path], cwd=tmp_path, expect="ok")
    assert written.returncode == 0, written.stderr
    config = tmp_path / "job.accelerate.yaml"
    assert "# Check with: accelkit config --check THIS_FILE" in config.read_text()
    check = invoke_fault(["config", "--check", str(config)], watch=[tmp_path], expect="ok")
    assert check.returncode == 0, check.stderr
    assert "OK" in check.stdout
    check.assert_clean()


def test_a_hand_written_two_machine_config_still_needs_its_address(tmp_path: Path) -> None:
    """The neighbour: the same file without the cluster-job header is a config for `accelerate launch` on each
    machine, which needs main_process_ip."""
    config = tmp_path / "two.yaml"
    config.write_text("distributed_type: MULTI_GPU\nnum_processes: 16\nnum_machines: 2\nmachine_rank: 0\n")
    invoke_fault(["config", "--check", str(config)], watch=[tmp_path]).assert_refused("no main_process_ip")


# -- item 2: tensor parallelism against the model's heads, where the model is known ---------------------------------
@pytest.mark.parametrize(("tp", "heads", "words"), [
    (4, {}, r"--tp-size 4 does not split the model's 4 attention heads and 2 kv heads"),
    (2, {"num_attention_heads": 6, "num_key_value_heads": 3}, r"--tp-size 2 does not split the model's 6 attention "
                                                               r"heads and 3 kv heads"),
    (4, {"num_attention_heads": 6, "num_key_value_heads": 6, "hidden_size": 96}, r"6 attention heads: each"),
])
def test_config_checks_tp_against_the_model_config(tp: int, heads: dict, words: str, tmp_path: Path) -> None:
    model = _model(tmp_path / "model", **heads)
    result = invoke_fault(["config", "--backend", "ddp", "--tp-size", str(tp), "--num-processes", str(tp),
                           "--model-config", str(model), "-o", str(tmp_path / "tp.yaml")], watch=[tmp_path])
    result.assert_refused(words)


def test_model_config_that_cannot_be_read(tmp_path: Path) -> None:
    result = invoke_fault(["config", "--backend", "ddp", "--tp-size", "2", "--num-processes", "2",
                           "--model-config", str(tmp_path / "nothing"), "-o", str(tmp_path / "tp.yaml")],
                          watch=[tmp_path])
    result.assert_refused(r"--model-config .*nothing: cannot read")


@pytest.mark.parametrize("how", ["--model-config", "script --model", "script --model_name_or_path="])
def test_launch_checks_tp_against_a_known_model_before_any_rank(how: str, tmp_path: Path) -> None:
    """Launch refuses before any rank starts when it knows the model: --model-config, or a local model folder the
    script is given (`--model DIR`, `--model_name_or_path=DIR`)."""
    _model(tmp_path / "model")
    script = ["train.py"]
    (tmp_path / "train.py").write_text("raise SystemExit('must not run')\n")
    if how == "--model-config":
        args = ["--model-config", "model", *script]
    elif how == "script --model":
        args = [*script, "--model", "model"]
    else:
        args = [*script, "--model_name_or_path=model"]
    result = run_fault(["launch", "--cpu", "--backend", "ddp", "--tp-size", "4", "--num-processes", "4", *args],
                       watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(r"--tp-size 4 does not split the model's 4 attention heads and 2 kv heads")
    assert "must not run" not in result.stderr


def test_launch_reads_the_heads_of_the_template_s_model_config(tmp_path: Path) -> None:
    """The causal-lm template builds its model config in code (`LlamaConfig(..., num_attention_heads=4,
    num_key_value_heads=2)`): launch reads it from the script's syntax (nothing runs) and refuses tp 4 at once."""
    project = _causal_lm(tmp_path)
    result = run_fault(["launch", "--cpu", "--backend", "ddp", "--tp-size", "4", "--num-processes", "4", "train.py",
                        "--max-steps", "1"], watch=[tmp_path], cwd=project)
    result.assert_refused(r"--tp-size 4 does not split the model's 4 attention heads and 2 kv heads: .* "
                          r"\(train\.py\)")
    assert not (project / "outputs").exists()  # no rank started


def _causal_lm(tmp_path: Path) -> Path:
    project = tmp_path / "lm"
    made = invoke_fault(["init", str(project), "--template", "causal-lm", "--backend", "ddp"], watch=[tmp_path],
                        expect="ok", record=False)
    assert made.returncode == 0, made.stderr
    return project


@pytest.mark.slow  # four real ranks
def test_tp_that_splits_heads_is_explained_from_the_real_rank_error(tmp_path: Path) -> None:
    """Where launch cannot know the model (here the template's heads are computed, not literal), the ranks start
    and die in transformers' attention (`shape '[8, 64, -1, 16]' is invalid`): one line naming the heads, not 175
    lines of traceback."""
    project = _causal_lm(tmp_path)
    text = (project / "train.py").read_text()
    assert "num_attention_heads=4," in text
    (project / "train.py").write_text(text.replace("num_attention_heads=4,", "num_attention_heads=int('4'),", 1))
    result = run_fault(["launch", "--cpu", "--backend", "ddp", "--tp-size", "4", "--num-processes", "4", "train.py",
                        "--max-steps", "1"], watch=[tmp_path], cwd=project)
    line = result.assert_refused(r"tensor parallelism tp_size 4 does not split the model's 4 attention heads and 2 "
                                 r"kv heads: each TP rank must hold whole heads \(transformers: shape '\[\d+, \d+, "
                                 r"-1, 16\]' is invalid\)", owned=[project / "outputs"])
    assert "divides both (2)" in result.stderr and line


@pytest.mark.slow  # two real ranks
def test_save_state_under_pure_tp_is_explained(tmp_path: Path) -> None:
    """Accelerate's save_state on a TP model without FSDP dies in id_tensor_storage ("invalid python storage"):
    named at the script's line, with the ways out."""
    project = _causal_lm(tmp_path)
    train = project / "train.py"
    text = train.read_text()
    guard = "    if not tensor_parallel_alone(accelerator):\n        accelerator.save_state"
    assert guard in text
    (project / "save_state_tp.py").write_text(text.replace(guard, "    if True:\n        accelerator.save_state", 1))
    result = run_fault(["launch", "--cpu", "--backend", "ddp", "--tp-size", "2", "--num-processes", "2",
                        "save_state_tp.py", "--max-steps", "1"], watch=[tmp_path], cwd=project)
    result.assert_refused(r"save_state_tp\.py:\d+ \(`accelerator\.save_state\(.*\)`\): Accelerate's save_state cannot "
                          r"write tensor-parallel weights without FSDP \(tp 2 with no dp_shard\)",
                          owned=[project / "outputs"])
    assert "torch.distributed.checkpoint" in result.stderr


# -- item 5: offline Hub, hints that name the command the user ran --------------------------------------------------
def test_plan_on_an_unreachable_hub_fails_at_once(tmp_path: Path) -> None:
    """Offline (here: the Hub endpoint is a closed port on loopback; HF_HUB_OFFLINE, which the suite sets, off) and
    not cached: one line within seconds, not huggingface_hub's five retries (six warning lines, ~23 s)."""
    hub_home = tmp_path / "hf-home"
    start = time.monotonic()
    result = run_fault(["plan", "meta-llama/Llama-2-7b-hf", "--gpu-memory", "80GB", "--gpus", "1"],
                       watch=[tmp_path], cwd=tmp_path,
                       env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(hub_home), "HF_HUB_OFFLINE": "0"})
    seconds = time.monotonic() - start
    result.assert_refused(r"offline \(127\.0\.0\.1 unreachable: connection refused\) and not in the local cache",
                          owned=[hub_home])
    assert "Retry" not in result.stderr and "thrown while requesting" not in result.stderr
    assert seconds < 15, seconds


@pytest.mark.parametrize(("args", "same"), [
    (["--num-processes", "1,2,4,8"], "backend ddp (the default)"),
    (["--backend", "fsdp"], "--backend fsdp"),
])
def test_bench_gpu_runs_without_gpus_hint_bench_cpu(args: list[str], same: str, tmp_path: Path) -> None:
    """Item 5: the hint was `accelkit launch --cpu ...` with 1 process for a 1,2,4,8 sweep; it is the bench command
    with --cpu and world sizes this machine's cores hold."""
    import os

    (tmp_path / "train.py").write_text("print('hi')\n")
    result = invoke_fault(["bench", *args, "train.py"], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(re.escape(f"bench's runs use {same}, which runs on GPUs, and this machine has none"))
    hint = result.stderr.split("Hint: ")[1]
    assert "accelkit bench --cpu --num-processes" in hint and "accelkit launch" not in hint
    counts = [int(n) for n in hint.split("--num-processes ")[1].split()[0].split(",")]
    assert counts and max(counts) <= (len(os.sched_getaffinity(0)) or 1)


def test_plan_prints_no_transformers_use_cache_line(tmp_path: Path) -> None:
    model = _model(tmp_path / "model")
    result = invoke_fault(["plan", str(model), "--gpu-memory", "80GB", "--gpus", "1", "--activation-checkpointing"],
                          watch=[tmp_path], cwd=tmp_path, expect="ok")
    assert result.returncode == 0, result.stderr
    assert "use_cache" not in result.stdout + result.stderr


def test_the_readme_first_workflow_prints_no_wrap_warning(tmp_path: Path) -> None:
    """Item 5: `accelkit init --template minimal --backend fsdp` then `accelkit launch --backend fsdp --cpu ...`
    warned about a transformer wrap policy on the project's own template (here as a dry run: the same checks)."""
    made = invoke_fault(["init", str(tmp_path / "my-run"), "--template", "minimal", "--backend", "fsdp"],
                        watch=[tmp_path], expect="ok", record=False)
    assert made.returncode == 0 and "Warning" not in made.stderr
    for args in (["--backend", "fsdp", "--num-processes", "2"], ["--config", "my-run/accelerate_config.yaml"]):
        result = run_fault(["launch", *args, "--cpu", "--dry-run", "my-run/train.py"], watch=[tmp_path],
                           cwd=tmp_path, expect="ok")
        assert result.returncode == 0, result.stderr
        assert "Warning" not in result.stderr


@pytest.mark.parametrize(("args", "words"), [
    (["--steps", BIG], r"--steps 100,000,000,000,000,000,000 is beyond any benchmark window"),
    (["--warmup", BIG], r"--warmup 100,000,000,000,000,000,000 is beyond any benchmark window"),
    (["--num-processes", BIG], r"--num-processes 100,000,000,000,000,000,000 is more than any cluster has"),
    (["--comm", "--comm-iters", BIG], r"--comm-iters 100,000,000,000,000,000,000 is beyond any measurement"),
    (["--comm", "--comm-sizes", "1K:2PiB"], r"--comm-sizes 1K:2PiB: 2PiB is more than any GPU holds"),
])
def test_bench_counts_beyond_any_run_are_refused(args: list[str], words: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    script = [] if "--comm" in args else ["train.py"]
    result = invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), *args, *script], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(words)


@pytest.mark.parametrize(("option", "value"), [("--min-time", "1e300"), ("--timeout", "1e300")])
def test_bench_seconds_beyond_30_days_are_usage_errors(option: str, value: str, tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    result = invoke_fault(["bench", "--cpu", "-o", str(tmp_path / "out"), option, value, "train.py"],
                          watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(rf"'{option}': '{value}' seconds is more than 30 days", exit_code=2, hint=False)


@pytest.mark.parametrize(("flag", "words"), [
    ("--layers", r"--layers 100,000,000,000,000,000,000 is beyond any model"),
    ("--hidden", r"--hidden 100,000,000,000,000,000,000 is beyond any model"),
    ("--vocab", r"--vocab 100,000,000,000,000,000,000 is beyond any model"),
])
def test_plan_shape_flags_beyond_any_model_are_refused(flag: str, words: str, tmp_path: Path) -> None:
    """Before: --layers 10^20 built the model for minutes; --hidden 10^20 was an overflow in transformers."""
    shape = {"--layers": "2", "--hidden": "64", "--heads": "4"}
    shape[flag] = BIG
    args = [word for pair in shape.items() for word in pair]
    result = invoke_fault(["plan", *args, "--gpu-memory", "80GB", "--gpus", "1"], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(words)


def test_merge_shard_size_in_petabytes_is_a_size(tmp_path: Path) -> None:
    """`--max-shard-size 2PiB` was "cannot read shard size": it is read (one shard) and the merge goes on to the
    input, which here does not exist."""
    result = invoke_fault(["merge-ckpt", str(tmp_path / "missing"), "-o", str(tmp_path / "out"),
                           "--max-shard-size", "2PiB"], watch=[tmp_path])
    line = result.assert_refused(r"missing")
    assert "shard size" not in line
