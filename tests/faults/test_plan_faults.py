"""`accelkit plan` on bad input: one `Error:` line naming the problem, a `Hint:` with the fix, exit 1 (2 for click
usage errors), nothing written or changed, no temporary files, no processes left."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import pytest
from helpers import DATA
from helpers.faults import invoke_fault, run_fault


@pytest.fixture(autouse=True)
def private_temp(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The command's temporary files go to a folder of this test (outside the watched tree), which the harness
    checks for leftovers: other jobs on a shared machine fill the system one at the same time."""
    folder = tmp_path_factory.mktemp("plan-fault-tmp")
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


MEMORY = ["--gpu-memory", "80GB", "--gpus", "1"]  # explicit hardware: no GPU detection (no torch import)
SEVEN_B = ["--params", "7B", *MEMORY]


@pytest.mark.parametrize("args, match", [
    (["./no-such-model", *MEMORY], r"unknown model `\./no-such-model`: no such file or directory"),
    (["--params", "7B"], r"no GPU to read the memory of, and --gpu-memory was not given"),
    (["--params", "7B", "--gpu-memory", "80G"], r"--gpu-memory '80G' is not a size"),
    (["--params", "7B", "--gpu-memory", "eighty"], r"--gpu-memory 'eighty' is not a size"),
    (["--params", "7B", *MEMORY, "--cpu-memory", "-1GB"], r"--cpu-memory '-1GB' is not a size"),
    (["--params", "7X", *MEMORY], r"--params '7X' is not a count"),
    (["--params", "0", *MEMORY], r"--params '0' must be a whole number of at least 1"),
    (["--params", "7B", "--gpus", "3", "--nodes", "2"],
     r"--num-processes 3 does not divide evenly over --num-machines 2"),
    (["--params", "7B", "--gpu-memory", "80GB", "--nodes", "2"], r"--num-machines 2 needs --num-processes \(the total"),
    ([*SEVEN_B, "--base-lr", "3e-4"], r"--base-lr needs --base-batch too"),
    ([*SEVEN_B, "--seq-len", "0"], r"--seq-len 0 must be at least 1"),
    (["--layers", "32", *MEMORY], r"a model shape needs --hidden, --heads too"),
    (["model-dir", "--params", "7B", *MEMORY], r"MODEL and --params both describe the model"),
    ([*SEVEN_B, "--measure", "missing.py"], r"script not found: missing.py"),
    # values no model or machine has: typos, refused with the limit instead of planned
    (["--params", "1e15", *MEMORY], r"--params 1e15 \(1,000,000,000,000,000 parameters\) is beyond any model"),
    (["--params", "7B", "--gpus", "1", "--gpu-memory", "1e30GB"], r"--gpu-memory 1e30GB is more than any GPU"),
    (["--params", "7B", "--gpu-memory", "80GB", "--gpus", "100000000000"],
     r"--num-processes 100,000,000,000 is more than any cluster has"),
    ([*SEVEN_B, "--cpu-memory", "1e30GB"], r"--cpu-memory 1e30GB is more than any machine holds"),
    (["--params", "5000", *MEMORY], r"--params 5,000 is smaller than the smallest Llama shape"),
    # --layout / --pp-schedule / --microbatches (issue 34): refused before anything is built
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=4,zz=2"], r"--layout: unknown dimension 'zz'"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=4,pp=0"],
     r"--layout: 'pp=0': a size is a whole number of 1 or more"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "pp=2,pp=2"], r"--layout: pp is given twice"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=4,pp=2", "--gpus", "4"],
     r"--layout dp_shard=4,pp=2 multiplies to 8 GPUs, not --num-processes 4"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=4,pp=2", "--pp-schedule", "zigzag"],
     r"--pp-schedule 'zigzag' is not a pipeline schedule"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=4", "--pp-schedule", "1F1B"],
     r"--pp-schedule needs a pipeline: --layout has no pp dimension"),
    (["--params", "7B", *MEMORY, "--microbatches", "4"], r"--microbatches needs a pipeline: give --layout with pp=N"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "sp=2,pp=2"], r"--layout: pp does not compose with sp"),
    (["--params", "7B", "--gpu-memory", "80GB", "--layout", "dp_shard=2,pp=2", "--strategy", "ddp"],
     r"--strategy and --layout both name what to plan"),
])
def test_bad_input_is_refused_before_any_work(tmp_path: Path, args: list[str], match: str) -> None:
    invoke_fault(["plan", *args], watch=[tmp_path], cwd=tmp_path).assert_refused(match)


# in process in the fast loop: tests/unit/plan/test_plan_cli.py
@pytest.mark.slow  # builds the model with transformers in a fresh interpreter (3-4 s of CPU)
@pytest.mark.parametrize("args, match, hint", [
    (["--params", "7B", "--gpu-memory", "80GB", "--gpus", "4", "--strategy", "fsdp-hybrid"],
     r"needs --num-machines 2 or more", "fsdp-full"),
    ([*SEVEN_B, "--strategy", "zero2"], r"ZeRO-2 on 1 GPU shards nothing .* no memory saved", "zero3-offload"),
    (["--params", "7B", "--gpu-memory", "80GB", "--gpus", "4", "--micro-batch", "2", "--global-batch", "20"],
     r"--global-batch 20 is not a whole number of steps of 8 samples .* accumulation would be 2\.5", "16 or 24"),
])
def test_impossible_combinations_say_why_and_what_works(tmp_path: Path, args: list[str], match: str,
                                                        hint: str) -> None:
    result = run_fault(["plan", *args], watch=[tmp_path], cwd=tmp_path)
    result.assert_refused(match)
    assert hint in result.stderr


def test_offline_hub_id(tmp_path: Path) -> None:
    hub_home = tmp_path / "hf-home"  # an empty cache: nothing to fall back on
    result = run_fault(["plan", "meta-llama/Llama-2-7b-hf", *MEMORY], watch=[tmp_path], cwd=tmp_path,
                       env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(hub_home)})
    result.assert_refused(r"cannot fetch config.json of `meta-llama/Llama-2-7b-hf` from the Hugging Face Hub: "
                          r"offline", owned=[hub_home])
    assert "hf download meta-llama/Llama-2-7b-hf config.json" in result.stderr


def test_a_folder_that_is_not_a_model(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    invoke_fault(["plan", str(tmp_path / "empty"), *MEMORY], watch=[tmp_path]).assert_refused(
        r"holds neither config.json nor an accelkit project")


def test_an_existing_config_is_not_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "plan.yaml"
    target.write_text("mine\n")
    invoke_fault(["plan", *SEVEN_B, "--write-config", str(target)], watch=[tmp_path]).assert_refused(
        r"plan.yaml already exists")
    assert target.read_text() == "mine\n"


@pytest.mark.slow  # builds the model with transformers in a fresh interpreter (3-4 s of CPU)
def test_a_read_only_folder_names_the_cause(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    result = run_fault(["plan", "--params", "7B", "--gpu-memory", "80GB", "--gpus", "8", "--write-config",
                        str(folder / "plan.yaml")],
                       watch=[tmp_path], readonly=folder)
    assert str(folder) in result.assert_refused(r"read-only")


def test_script_arguments_without_measure_are_a_usage_error(tmp_path: Path) -> None:
    result = invoke_fault(["plan", *SEVEN_B, "--", "--lr", "1"], watch=[tmp_path])
    assert result.returncode == 2 and "arguments after `--` go to the script of --measure" in result.stderr
    result.assert_clean()


@pytest.mark.slow  # a real 2-rank launch, stopped with SIGTERM
def test_sigterm_during_measure_stops_every_rank_and_leaves_nothing(tmp_path: Path) -> None:
    script = DATA / "plan" / "wait_before_step.py"  # its ranks wait, measuring, until the signal comes
    args = ["plan", "--params", "1M", "--gpu-memory", "80GB", "--gpus", "2", "--strategy", "ddp", "--measure",
            str(script)]
    result = run_fault(args, watch=[tmp_path], cwd=tmp_path, send_signal=("READY rank", signal.SIGTERM),
                       expect="signal", kind="signal")
    assert result.returncode == 143 and "Terminated (signal 15)" in result.stderr, result.stderr[-2000:]
    result.assert_clean()


@pytest.mark.slow  # a real 2-rank launch
def test_a_script_that_fails_before_its_first_step(tmp_path: Path) -> None:
    result = run_fault(["plan", "--params", "1M", "--gpu-memory", "80GB", "--gpus", "2", "--strategy", "ddp",
                        "--measure", str(DATA / "plan" / "crash_before_step.py")], watch=[tmp_path], cwd=tmp_path)
    # The script's own traceback (from its ranks) is shown, as `accelkit launch` shows it; then accelkit's one line.
    assert result.returncode == 1 and "lossss is not defined" in result.stderr
    (line,) = result.error_lines
    assert "crash_before_step.py failed (exit status 1) before its first optimizer step" in line
    assert "Hint: run the same launch without --measure" in result.stderr
    result.assert_clean()


def test_a_gpu_count_that_is_not_a_whole_number_is_a_usage_error(tmp_path: Path) -> None:
    result = invoke_fault(["plan", "--params", "7B", "--gpu-memory", "80GB", "--gpus", "1e11"], watch=[tmp_path],
                          cwd=tmp_path)
    result.assert_refused(r"'1e11' is not a valid integer", exit_code=2, hint=False)


# in process in the fast loop: tests/unit/plan/test_plan_cli.py
@pytest.mark.slow  # builds the model with transformers in a fresh interpreter (3-4 s of CPU)
@pytest.mark.parametrize("config, args, match, hint", [
    ({"model_type": "llama"}, [], r"gives none of hidden_size, num_hidden_layers, num_attention_heads, vocab_size: "
                                  r"transformers would fill them with LlamaConfig's defaults", "--params"),
    ({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 300, "n_positions": 128},
     ["--seq-len", "256"], r"--seq-len 256 is beyond the model's max_position_embeddings 128", "--seq-len 128"),
    ({"model_type": "llama", "hidden_size": "big"}, [],
     r"config.json: Field 'hidden_size' expected int, got str \(value: 'big'\)$", "fix that field"),
    ({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 7}, [],
     r"The hidden size \(64\) is not a multiple of the number of attention heads \(7\)", "fix that field"),
])
def test_configs_that_would_plan_the_wrong_model(tmp_path: Path, config: dict, args: list[str], match: str,
                                                 hint: str) -> None:
    """A config without sizes (transformers' defaults: a 6.74B Llama), a sequence the model was not built for, a
    field of the wrong type: refused, in words (no exception class names)."""
    import json

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps(config))
    result = run_fault(["plan", str(tmp_path / "model"), *MEMORY, *args], watch=[tmp_path], cwd=tmp_path)
    line = result.assert_refused(match)
    assert hint in result.stderr and "Strict" not in line and "Error:" not in line[len("Error:"):]


@pytest.mark.slow  # builds the model with transformers in a fresh interpreter (3-4 s of CPU)
@pytest.mark.parametrize("template", ["seq-classification", "image-classification"])
def test_planning_a_project_loads_no_data_set_and_leaves_no_folder(tmp_path: Path, template: str) -> None:
    """The project's model needs its labels (and words), not the datasets machinery: no cache written under
    HF_HOME, no progress bar, and no empty torchinductor_* folder (torch makes one at import) in the temp dir."""
    from accelkit.scaffold import init_project

    init_project(tmp_path / "run", template)
    hf_home, temp = tmp_path / "hf-home", tmp_path.parent / f"{tmp_path.name}-tmp"
    hf_home.mkdir()
    temp.mkdir()
    result = run_fault(["plan", str(tmp_path / "run"), *MEMORY], watch=[tmp_path], cwd=tmp_path, expect="ok",
                       env={"HF_HOME": str(hf_home), "TMPDIR": str(temp)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "(accelkit project, template " in result.stdout
    assert "examples/s" not in result.stderr and "Generating" not in result.stderr, result.stderr[-2000:]
    result.assert_clean()  # HF_HOME is inside the watched tree: nothing created there
    assert list(temp.iterdir()) == []


@pytest.mark.slow  # builds the model with transformers in a fresh interpreter (3-4 s of CPU)
def test_a_project_whose_data_is_on_the_hub_is_not_downloaded(tmp_path: Path) -> None:
    from accelkit.scaffold import init_project

    init_project(tmp_path / "run", "seq-classification")
    train_py = tmp_path / "run" / "train.py"
    source = train_py.read_text()
    train_py.write_text(source.replace('"--dataset", default=None', '"--dataset", default="stanfordnlp/imdb"'))
    assert train_py.read_text() != source
    hf_home = tmp_path / "hf-home"
    result = run_fault(["plan", str(tmp_path / "run"), *MEMORY], watch=[tmp_path], cwd=tmp_path,
                       env={"HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1"})
    result.assert_refused(r"data set `stanfordnlp/imdb` is not local files, and the plan does not download")


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_stall_timeout_that_is_not_finite_is_refused(tmp_path: Path, value: str) -> None:
    result = invoke_fault(["plan", *SEVEN_B, "--stall-timeout", value], watch=[tmp_path], kind="bad option")
    assert result.returncode == 2 and "'--stall-timeout'" in result.stderr and "not a finite number" in result.stderr
    assert not result.traceback and not result.touched_outside([])


@pytest.mark.slow  # a real 1-rank launch that hangs before its first step
def test_a_measured_run_that_hangs_is_reported_as_a_stall_with_its_stack(tmp_path: Path) -> None:
    script = DATA / "plan" / "wait_before_step.py"  # its rank sleeps before its first backward
    result = run_fault(["plan", "--params", "1M", "--gpu-memory", "80GB", "--gpus", "1", "--strategy", "single",
                        "--stall-timeout", "3", "--measure", str(script)], watch=[tmp_path], cwd=tmp_path,
                       kind="hang", expect="refused", timeout=180)
    line = result.assert_refused(r"wait_before_step\.py stalled and was stopped: no rank progressed for \d+ s; .*"
                                 r"rank 0 at \S*wait_before_step\.py:15 in <module>", exit_code=124)
    assert "--stall-timeout (now 3 s" in result.stderr and "before its first optimizer step" not in line
    assert 'wait_before_step.py", line 15, in <module>' in result.stderr  # the rank's stack
