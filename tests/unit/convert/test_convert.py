"""`accelkit convert`: golden outputs of the corpus, idempotence, snippets of each checklist item, and the CLI."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from helpers import DATA, invoke_accelkit

from accelkit.convert.codemod import ConvertOptions, convert_source
from accelkit.errors import AccelkitError

CONVERT_DATA = DATA / "convert"
# corpus/: one script per idiom of issue #16 and their combinations (also --checked on 2 ranks, see
# tests/integration/test_convert_check.py); shapes/: more script shapes, pinned by golden output and 1-process runs
CORPUS = sorted((CONVERT_DATA / "corpus").glob("*.py")) + sorted((CONVERT_DATA / "shapes").glob("*.py"))
GOLDEN = CONVERT_DATA / "golden"
UPDATE = os.environ.get("ACCELKIT_UPDATE_GOLDEN") == "1"  # regenerate tests/data/convert/golden/


def convert(source: str, **options) -> str:
    return convert_source(source, ConvertOptions(**options)).code


@pytest.mark.parametrize("script", CORPUS, ids=lambda p: p.stem)
def test_corpus_matches_golden_and_is_idempotent(script: Path) -> None:
    result = convert_source(script.read_text(), filename=script.name)
    report = result.report.format(script.name) + "\n"
    golden_code, golden_report = GOLDEN / script.name, GOLDEN / f"{script.stem}.report.txt"
    if UPDATE:
        golden_code.write_text(result.code)
        golden_report.write_text(report)
    assert result.changed
    assert result.code == golden_code.read_text()
    assert report == golden_report.read_text()
    compile(result.code, script.name, "exec")
    again = convert_source(result.code, filename=script.name)
    assert not again.changed and again.code == result.code
    assert again.report.status == "already-accelerate"
    # every checklist item the script needs is in the output
    assert result.code.count("accelerator = Accelerator(") == 1
    assert "accelerator.prepare(" in result.code
    assert ".backward()" not in result.code and "accelerator.backward(" in result.code
    assert "print(" not in result.code.replace("accelerator.print(", "")


def test_corpus_covers_the_shapes_the_issue_lists() -> None:
    names = {p.stem for p in CORPUS}
    assert {"mnist_style", "trainer_gpu_id", "manual_batching", "manual_sgd", "gan", "amp_clip", "lbfgs",
            "module_level", "global_device", "torch_accelerator",
            # issue #16, idiom by idiom
            "warmup_plateau", "custom_init", "trainer_class", "prebatched", "random_batches", "regression_numpy",
            "eval_metrics", "side_effects", "dcgan",
            # issue #23: the defects of the conversions, hand-made batch sources
            "main_guard", "downloads_progress", "word_lm", "random_regression", "iterable_stream",
            # issue #23: torch.distributed scripts
            "ddp_torchrun", "ddp_or_single",
            # issue #41: a data-dependent init (ActNorm) before prepare
            "actnorm_init"} <= names


def test_untouched_code_keeps_formatting_and_comments() -> None:
    source = (
        "import torch  # the framework\n\n"
        "def helper( a,b ):   # odd spacing stays\n"
        "    return a+b  # sum\n\n"
        "device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')\n"
        "x = torch.ones(2).to(device)\n"
        "loss = (x * 2).sum()\n"
        "loss.backward()\n"
    )
    out = convert(source)
    assert "def helper( a,b ):   # odd spacing stays\n    return a+b  # sum\n" in out
    assert "import torch  # the framework\n" in out
    assert "device = accelerator.device\n" in out
    assert "x = torch.ones(2).to(device)\n" in out  # tensors not from a loader keep their move
    assert "accelerator.backward(loss)\n" in out


def test_backward_of_any_expression_and_kwargs() -> None:
    out = convert("import torch\n(l1 + l2).backward()\nloss.backward(retain_graph=True)\nz.backward(g)\n"
                  "torch.autograd.backward([y])\n")
    assert "accelerator.backward(l1 + l2)\n" in out
    assert "accelerator.backward(loss, retain_graph=True)\n" in out
    assert "accelerator.backward(z, gradient=g)\n" in out
    assert "torch.autograd.backward([y])" in out


def test_cuda_calls_integer_ids_and_set_device() -> None:
    source = ("import torch\nimport torch.nn as nn\n"
              "torch.cuda.set_device(0)\n"
              "model = nn.Linear(2, 2).cuda()\n"
              "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
              "x = torch.randn(3, 2).cuda()\n"
              "y = torch.zeros(3, device='cuda')\n"
              "w = torch.ones(2).to(0)\n"
              "print(model.module.weight, model.weight)\n")
    out = convert(source)
    assert "set_device" not in out
    assert "model = nn.Linear(2, 2)\n" in out
    assert "x = torch.randn(3, 2).to(accelerator.device)\n" in out
    assert "y = torch.zeros(3, device=accelerator.device)\n" in out
    assert "w = torch.ones(2).to(accelerator.device)\n" in out
    assert "accelerator.print(accelerator.unwrap_model(model).weight, accelerator.unwrap_model(model).weight)" in out
    assert "model, opt = accelerator.prepare(model, opt)\n" in out
    # module-level script without argparse: the Accelerator comes right after the imports
    assert out.index("accelerator = Accelerator()") < out.index("model = nn.Linear")


def test_prepare_is_placed_before_first_use_and_split_when_needed() -> None:
    source = ("import torch\nfrom torch.utils.data import DataLoader\n"
              "def main():\n"
              "    model = torch.nn.Linear(2, 2)\n"
              "    opt = torch.optim.Adam(model.parameters())\n"
              "    model.train()\n"
              "    train(model, opt)\n"
              "    eval_loader = DataLoader([1, 2, 3])\n"
              "    evaluate(model, eval_loader)\n")
    out = convert(source)
    # model.train() only sets a mode: prepare goes right before the model is handed to the training function
    assert ("    opt = torch.optim.Adam(model.parameters())\n    model.train()\n"
            "    model, opt = accelerator.prepare(model, opt)\n    train(model, opt)\n") in out
    assert "    eval_loader = DataLoader([1, 2, 3])\n    eval_loader = accelerator.prepare(eval_loader)\n" in out


def test_a_look_at_the_first_batch_stays_before_prepare() -> None:
    """A data-dependent init (ActNorm) reads `next(iter(loader))`, directly or in a helper: it must read the loader
    not yet sharded (the batch the original reads, the same on every process) and change the model before prepare
    copies rank 0's weights; a loop over the loader still runs it."""
    head = ("import torch\nfrom torch.utils.data import DataLoader\n"
            "def init_from(model, loader):\n"
            "    x = next(iter(loader))\n"
            "    model.bias.data.copy_(-x.mean())\n"
            "def init_from_batch(model, x):\n"
            "    model.bias.data.copy_(-x.mean())\n"
            "def main():\n"
            "    loader = DataLoader(torch.randn(16, 2), batch_size=4)\n"
            "    model = torch.nn.Linear(2, 2)\n")
    tail = ("    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
            "    for x in loader:\n"
            "        model(x).sum().backward()\n")
    prepared = "    model, opt, loader = accelerator.prepare(model, opt, loader)\n    for x in loader:\n"
    inline = "    x0 = next(iter(loader))\n    init_from_batch(model, x0)\n"
    for init in ("    init_from(model, loader)\n", inline):
        out = convert(head + init + tail)
        assert init + tail.splitlines(keepends=True)[0] + prepared in out, out
    # a helper that loops over the loader runs it: prepared before
    looping = head.replace("    x = next(iter(loader))\n", "    for x in loader:\n        pass\n")
    out = convert(looping + "    init_from(model, loader)\n" + tail)
    assert out.index("accelerator.prepare(") < out.index("    init_from(model, loader)\n"), out


def test_amp_with_scaler_checkpoint_and_mixed_precision_option() -> None:
    source = ("import torch\nfrom torch.cuda.amp import GradScaler, autocast\n"
              "scaler = GradScaler()\n"
              "for x in data:\n"
              "    with autocast():\n"
              "        loss = model(x)\n"
              "    scaler.scale(loss).backward()\n"
              "    scaler.step(optimizer)\n"
              "    scaler.update()\n"
              "ckpt = {'scaler': scaler.state_dict()}\n")
    result = convert_source(source)
    out = result.code
    assert "GradScaler" not in out and "from torch.cuda.amp" not in out  # unused import removed too
    assert 'accelerator = Accelerator(mixed_precision="fp16")' in out
    assert "    with accelerator.autocast():\n" in out
    assert "    accelerator.backward(loss)\n    optimizer.step()\n" in out
    assert "ckpt = {'scaler': accelerator.scaler.state_dict()}" in out
    assert any("accelerator.scaler" in note.why for note in result.report.left_alone)
    assert 'Accelerator(mixed_precision="bf16")' in convert(source, mixed_precision="bf16")


def test_argparse_in_main_puts_the_accelerator_after_parsing() -> None:
    source = ("import argparse\nimport torch\n"
              "def main():\n"
              "    '''Doc.'''\n"
              "    parser = argparse.ArgumentParser()\n"
              "    args = parser.parse_args()\n"
              "    device = torch.device('cuda')\n"
              "    print(args, device)\n"
              "main()\n")
    out = convert(source)
    assert "    args = parser.parse_args()\n    accelerator = Accelerator()\n    device = accelerator.device\n" in out
    assert "global accelerator" not in out  # every use is inside main()


def test_save_waits_then_saves_unwrapped_model_on_main_process() -> None:
    source = ("import torch\nmodel = torch.nn.Linear(2, 2)\nopt = torch.optim.SGD(model.parameters(), lr=1)\n"
              "for i in range(2):\n    opt.step()\n"
              "if True:\n    # keep this comment\n    torch.save(model.state_dict(), 'm.pt')\n")
    out = convert(source)
    assert ("    # keep this comment\n    accelerator.wait_for_everyone()\n"
            "    accelerator.save(accelerator.unwrap_model(model).state_dict(), 'm.pt')\n") in out


def test_evaluation_loop_gathers_predictions_and_labels() -> None:
    out = (GOLDEN / "mnist_style.py").read_text()
    assert "output, target = accelerator.gather_for_metrics((output, target))" in out


def test_already_distributed_scripts_are_refused() -> None:
    for source, reason in [
        ("import torch.multiprocessing as mp\nmp.spawn(train, nprocs=2)\n", "spawns its own worker processes"),
        ("import deepspeed\nengine, *_ = deepspeed.initialize(model=m)\n", "deepspeed.initialize"),
    ]:
        with pytest.raises(AccelkitError, match=reason):
            convert_source(source)


def test_syntax_errors_name_the_line_and_column() -> None:
    with pytest.raises(AccelkitError, match=r"x\.py:2:5: syntax error, cannot convert: .\(. was never closed"):
        convert_source("import torch\nx = (1, 2\n", filename="x.py")


def test_script_without_anything_to_convert_is_unchanged() -> None:
    result = convert_source("import math\nprint_ = math.pi\n")
    assert not result.changed and result.report.status == "unchanged"


@pytest.fixture
def script(tmp_path: Path) -> Path:
    path = tmp_path / "train.py"
    path.write_text((CONVERT_DATA / "corpus" / "lbfgs.py").read_text())
    return path


def test_cli_writes_default_output_and_refuses_to_overwrite(script: Path) -> None:
    original = script.read_text()
    proc = invoke_accelkit("convert", str(script), check=True)
    out = script.with_name("train_accelerate.py")
    assert out.read_text() == (GOLDEN / "lbfgs.py").read_text()
    assert "accelerator.backward(loss)" in proc.stdout and "Wrote" in proc.stdout
    proc = invoke_accelkit("convert", str(script))
    assert proc.returncode == 1 and "already exists" in proc.stderr and "--force" in proc.stderr
    assert invoke_accelkit("convert", str(script), "--force").returncode == 0
    assert script.read_text() == original


def test_cli_diff_check_in_place(script: Path) -> None:
    original = script.read_text()
    proc = invoke_accelkit("convert", str(script), "--diff", check=True)
    assert "+from accelerate import Accelerator" in proc.stdout and "-    model.to(device)" in proc.stdout
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]
    # CI use (was `--check` before --check meant running the conversion): exit 1 when there is something to do
    assert invoke_accelkit("convert", str(script), "--diff", "--exit-code").returncode == 1
    assert sorted(p.name for p in script.parent.iterdir()) == ["train.py"]
    invoke_accelkit("convert", str(script), "--in-place", check=True)
    assert script.with_name("train.py.bak").read_text() == original
    assert "Accelerator()" in script.read_text()
    proc = invoke_accelkit("convert", str(script), "--diff", "--exit-code")
    assert proc.returncode == 0 and "already uses Accelerate" in proc.stderr
    assert invoke_accelkit("convert", str(script), "--exit-code").returncode == 2  # only with --diff
    proc = invoke_accelkit("convert", str(script), "--diff", "-o", "x.py")
    assert proc.returncode == 2


def test_cli_reports_syntax_errors_and_refusals(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("def f(:\n    pass\n")
    proc = invoke_accelkit("convert", str(bad))
    assert proc.returncode == 1 and "bad.py:1:7: syntax error" in proc.stderr and "Traceback" not in proc.stderr
    ddp = tmp_path / "ddp.py"
    ddp.write_text("import torch.multiprocessing as mp\nmp.spawn(print, nprocs=2)\n")
    proc = invoke_accelkit("convert", str(ddp))
    assert proc.returncode == 1 and "already does distributed training" in proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.py", "ddp.py"]


def test_argument_helper_puts_the_accelerator_after_its_call() -> None:
    source = ("import argparse\nimport torch\n"
              "def get_args():\n    p = argparse.ArgumentParser()\n    return p.parse_args()\n"
              "def main():\n    args = get_args()\n    model = torch.nn.Linear(2, 1).cuda()\n"
              "    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n    model(torch.ones(1, 2)).sum().backward()\n"
              "main()\n")
    out = convert(source)
    assert "    args = get_args()\n    accelerator = Accelerator()\n    model = torch.nn.Linear(2, 1)\n" in out
    assert "model(torch.ones(1, 2).to(accelerator.device))" in out  # the input follows the model's device
    assert "return p.parse_args()\n" in out and out.count("Accelerator()") == 1


def test_objects_created_in_a_class_are_prepared_there() -> None:
    source = ("import torch\nfrom torch.utils.data import DataLoader\n"
              "class T:\n"
              "    def __init__(self, device):\n"
              "        self.model = torch.nn.Linear(4, 2).to(device)\n"
              "        self.opt = torch.optim.AdamW(self.model.parameters())\n"
              "        self.loader = DataLoader(list(range(10)), batch_size=2)\n"
              "    def fit(self):\n"
              "        for x in self.loader:\n"
              "            self.model(x).sum().backward()\n"
              "            self.opt.step()\n"
              "        return self.model.custom()\n"
              "if __name__ == '__main__':\n    T('cuda').fit()\n")
    out = convert(source)
    assert ("        self.loader = DataLoader(list(range(10)), batch_size=2)\n"
            "        self.model, self.opt, self.loader = accelerator.prepare("
            "self.model, self.opt, self.loader)\n") in out
    assert "accelerator.backward(self.model(x).sum())" in out
    assert "return accelerator.unwrap_model(self.model).custom()" in out
