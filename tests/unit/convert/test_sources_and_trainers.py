"""Issue #23: hand-made batch sources found through helpers and module-level assignments, and scripts that train
through a framework's trainer (nothing changed, one line on how to launch them)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from helpers import DATA, invoke_accelkit

from accelkit.convert.codemod import convert_source

TRAINERS = sorted((DATA / "convert" / "trainers").glob("*.py"))


def convert(source: str):
    return convert_source(textwrap.dedent(source).lstrip(), filename="train.py")


LM = """
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    def batchify(data, bsz):
        nbatch = data.size(0) // bsz
        return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous().to(device)
    train_data = batchify(torch.arange(200) % 7, 4)
    def get_batch(source, i):
        seq_len = min(5, len(source) - 1 - i)
        return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)
    model = torch.nn.Embedding(7, 7).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    def train():
        for i in range(0, train_data.size(0) - 1, 5):
            data, targets = get_batch(train_data, i)
            loss = torch.nn.functional.cross_entropy(model(data).view(-1, 7), targets)
            loss.backward()
            optimizer.step()
    train()
"""


def test_batchify_get_batch_data_is_sharded_in_contiguous_parts_where_it_is_bound() -> None:
    result = convert(LM)
    code = result.code
    assert ("train_data = batchify(torch.arange(200) % 7, 4)\n"
            "# each process trains on an equal contiguous part of the sequence") in code
    assert ("shard = slice(accelerator.process_index * (len(train_data) // accelerator.num_processes),\n"
            "              (accelerator.process_index + 1) * (len(train_data) // accelerator.num_processes))\n"
            "train_data = train_data[shard]\n") in code
    assert not result.report.problems
    assert any(f.kind == "batches" and f.name == "train_data" and "sharded" in f.action for f in result.report.found)


def test_independent_samples_keep_the_strided_distributed_sampler_order() -> None:
    code = convert("""
        import torch
        x, y = torch.randn(40, 3), torch.randn(40, 1)
        def cut(a, b, i):
            return a[i:i + 8], b[i:i + 8]
        model = torch.nn.Linear(3, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(0, len(x), 8):
            xb, yb = cut(x, y, i)
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
    """).code
    assert "shard = slice(accelerator.process_index, len(x) - len(x) % accelerator.num_processes, " in code
    assert "x, y = x[shard], y[shard]\n" in code


def test_random_batches_from_a_generator_function_are_seeded_per_process() -> None:
    result = convert("""
        import torch
        torch.manual_seed(3)
        def make_batch(n):
            x = torch.randn(n, 2)
            return x, x.sum(1, keepdim=True)
        def batches(steps):
            for _ in range(steps):
                yield make_batch(8)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for x, y in batches(10):
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """)
    assert "if accelerator.process_index > 0:\n    torch.manual_seed(3 + accelerator.process_index)\n" in result.code
    assert result.report.iteration_based and not result.report.problems


def test_unseeded_random_batches_get_torch_seeds_apart_too() -> None:
    # torch starts every process from the same default seed
    code = convert("""
        import torch
        def make_batch():
            x = torch.rand(8, 2)
            return x, x.sum(1, keepdim=True)
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10):
            x, y = make_batch()
            torch.nn.functional.mse_loss(model(x), y).backward()
            opt.step()
    """).code
    assert "    torch.manual_seed(torch.initial_seed() + accelerator.process_index)\n" in code


@pytest.mark.parametrize("script", TRAINERS, ids=lambda p: p.stem)
def test_trainer_scripts_are_left_as_they_are_with_one_line_of_advice(script: Path) -> None:
    result = convert_source(script.read_text(), filename=script.name)
    assert not result.changed and result.code == script.read_text()
    assert result.report.status == "trainer"
    text = result.report.format(script.name)
    assert "\n" not in text and "nothing to convert" in text and "accelkit launch " in text
    assert text.endswith((f"accelkit launch {script.name}",
                          f"--backend fsdp {script.name} (or --backend deepspeed --zero-stage 3, or --config "
                          "CONFIG.yaml from `accelkit config`)"))


def test_the_cli_prints_one_line_writes_nothing_and_exits_0(tmp_path: Path) -> None:
    script = tmp_path / "hf_trainer.py"
    script.write_text((DATA / "convert" / "trainers" / "hf_trainer.py").read_text())
    before = sorted(p.name for p in tmp_path.iterdir())
    result = invoke_accelkit("convert", str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().count("\n") == 0
    assert "transformers' `Trainer` (line 24), which already runs on Accelerate" in result.stdout
    assert "accelkit launch --backend fsdp hf_trainer.py" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == before
